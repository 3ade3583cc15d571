//! C declarations of the few PMIx 4.2 types, constants and functions this
//! crate uses, transcribed from Debian 12's
//! `/usr/lib/x86_64-linux-gnu/pmix2/include/pmix_common.h` and `pmix.h`
//! (PMIx 4.2.2). Nothing here is linked: the functions are resolved at run
//! time from the loaded library (see [`Api`]).

use std::ffi::{CStr, c_char, c_int, c_void};

/// `pmix_status_t`: `int`.
pub type Status = c_int;
/// `pmix_rank_t`: `uint32_t`.
pub type Rank = u32;
/// `pmix_data_type_t`: `uint16_t`.
pub type DataType = u16;
/// `pmix_scope_t`: `uint8_t`.
pub type Scope = u8;

/// `PMIX_MAX_NSLEN`: a namespace is `char[PMIX_MAX_NSLEN + 1]`.
pub const MAX_NSLEN: usize = 255;
/// `PMIX_MAX_KEYLEN`: a key is `char[PMIX_MAX_KEYLEN + 1]`.
pub const MAX_KEYLEN: usize = 511;

/// `PMIX_SUCCESS`.
pub const SUCCESS: Status = 0;
/// `PMIX_RANK_WILDCARD` (`UINT32_MAX-1`): every rank of a namespace.
pub const RANK_WILDCARD: Rank = u32::MAX - 1;

/// `PMIX_BOOL` type code.
pub const BOOL: DataType = 1;
/// `PMIX_STRING` type code.
pub const STRING: DataType = 3;
/// `PMIX_UINT32` type code.
pub const UINT32: DataType = 14;
/// `PMIX_BYTE_OBJECT` type code.
pub const BYTE_OBJECT: DataType = 27;

/// `PMIX_GLOBAL`: share with all procs, local and remote.
pub const GLOBAL: Scope = 3;

/// `PMIX_JOB_SIZE` (`uint32_t`): number of procs in this job.
pub const JOB_SIZE: &CStr = c"pmix.job.size";
/// `PMIX_COLLECT_DATA` (`bool`): a fence collects the committed data.
pub const COLLECT_DATA: &CStr = c"pmix.collect";

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Proc {
    /// `pmix_nspace_t`, NUL-terminated.
    pub nspace: [c_char; MAX_NSLEN + 1],
    /// `pmix_rank_t`.
    pub rank: Rank,
}

/// `pmix_byte_object_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ByteObject {
    /// `char *bytes`.
    pub bytes: *mut c_char,
    /// `size_t size`.
    pub size: usize,
}

/// The `data` union of `pmix_value_t`, reduced to the members this crate
/// reads or writes plus one that gives it the C union's size and alignment.
/// The largest C member is `pmix_envar_t` (`char *envar; char *value; char
/// separator;`, 24 bytes, 8-aligned); `struct timeval` and
/// `pmix_byte_object_t` are 16; everything else is a scalar or a pointer.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ValueData {
    /// `bool flag` (only written, for `PMIX_BOOL`).
    pub flag: bool,
    /// `char *string`.
    pub string: *mut c_char,
    /// `uint32_t uint32`.
    pub uint32: u32,
    /// `pmix_byte_object_t bo`.
    pub bo: ByteObject,
    /// `void *ptr`.
    pub ptr: *mut c_void,
    /// Stands in for `pmix_envar_t envar`, the largest member.
    pub envar: [usize; 3],
}

/// `pmix_value_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Value {
    /// `pmix_data_type_t type`.
    pub type_: DataType,
    /// The union, selected by `type_`.
    pub data: ValueData,
}

/// `pmix_info_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Info {
    /// `pmix_key_t`, NUL-terminated.
    pub key: [c_char; MAX_KEYLEN + 1],
    /// `pmix_info_directives_t flags` (`uint32_t`).
    pub flags: u32,
    /// `pmix_value_t value`.
    pub value: Value,
}

impl Info {
    /// An info entry `key = flag` of type `PMIX_BOOL` with no directives.
    pub fn new_bool(key: &CStr, flag: bool) -> Info {
        let mut info = Info {
            key: [0; MAX_KEYLEN + 1],
            flags: 0,
            value: Value { type_: BOOL, data: ValueData { envar: [0; 3] } },
        };
        info.value.data.flag = flag;
        // Keys here are our own short constants; the last byte stays NUL.
        for (dst, &src) in info.key.iter_mut().zip(key.to_bytes().iter().take(MAX_KEYLEN)) {
            *dst = src as c_char;
        }
        info
    }
}

/// `PMIx_Init(pmix_proc_t *proc, pmix_info_t info[], size_t ninfo)`.
pub type InitFn = unsafe extern "C" fn(*mut Proc, *mut Info, usize) -> Status;
/// `PMIx_Finalize(const pmix_info_t info[], size_t ninfo)`.
pub type FinalizeFn = unsafe extern "C" fn(*const Info, usize) -> Status;
/// `PMIx_Put(pmix_scope_t scope, const char key[], pmix_value_t *val)`.
pub type PutFn = unsafe extern "C" fn(Scope, *const c_char, *mut Value) -> Status;
/// `PMIx_Commit(void)`.
pub type CommitFn = unsafe extern "C" fn() -> Status;
/// `PMIx_Fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo)`.
pub type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const Info, usize) -> Status;
/// `PMIx_Get(const pmix_proc_t *proc, const char key[], const pmix_info_t info[], size_t ninfo, pmix_value_t **val)`.
pub type GetFn = unsafe extern "C" fn(*const Proc, *const c_char, *const Info, usize, *mut *mut Value) -> Status;
/// `PMIx_Value_destruct(pmix_value_t *val)`: frees what the value points to,
/// not the value itself. 4.2 has no `PMIx_Value_free`; its
/// `PMIX_VALUE_RELEASE` macro is `PMIx_Value_destruct` followed by
/// `pmix_free`, an inline `free()`.
pub type ValueDestructFn = unsafe extern "C" fn(*mut Value);
/// `const char* PMIx_Error_string(pmix_status_t status)`.
pub type ErrorStringFn = unsafe extern "C" fn(Status) -> *const c_char;

/// The resolved entry points, together with the library that holds them.
pub struct Api {
    /// Where the library was found (the name or path given to `dlopen`).
    pub path: String,
    /// Keeps the code behind the function pointers mapped.
    pub _lib: libloading::Library,
    /// `PMIx_Init`.
    pub init: InitFn,
    /// `PMIx_Finalize`.
    pub finalize: FinalizeFn,
    /// `PMIx_Put`.
    pub put: PutFn,
    /// `PMIx_Commit`.
    pub commit: CommitFn,
    /// `PMIx_Fence`.
    pub fence: FenceFn,
    /// `PMIx_Get`.
    pub get: GetFn,
    /// `PMIx_Value_destruct`.
    pub value_destruct: ValueDestructFn,
    /// `PMIx_Error_string`.
    pub error_string: ErrorStringFn,
}

impl Api {
    /// Opens the first of `candidates` that loads and has every symbol.
    /// On failure the message lists each candidate and why it failed.
    pub fn open(candidates: &[String]) -> Result<Api, String> {
        let mut why = Vec::new();
        for name in candidates {
            match Self::open_one(name) {
                Ok(api) => return Ok(api),
                Err(e) => why.push(format!("{name}: {e}")),
            }
        }
        Err(why.join("; "))
    }

    fn open_one(name: &str) -> Result<Api, libloading::Error> {
        // SAFETY: loading runs the library's ELF initialisers. libpmix is a
        // plain C library made to be dlopen()ed (Open MPI loads it from a
        // plugin this way); its initialisers only set up internal state.
        let lib = unsafe { libloading::Library::new(name) }?;
        // SAFETY (every `sym` call below): each type is the prototype from the
        // PMIx 4.2 headers quoted on the type alias, and the copied function
        // pointer lives in the same `Api` as `lib`, which is never dropped
        // before it (the `Api` is kept in a process-wide static).
        unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: forwarded to the caller, see above.
            unsafe { lib.get::<T>(name).map(|s| *s) }
        }
        // SAFETY: see the comment on `sym`.
        unsafe {
            Ok(Api {
                path: name.to_owned(),
                init: sym(&lib, b"PMIx_Init\0")?,
                finalize: sym(&lib, b"PMIx_Finalize\0")?,
                put: sym(&lib, b"PMIx_Put\0")?,
                commit: sym(&lib, b"PMIx_Commit\0")?,
                fence: sym(&lib, b"PMIx_Fence\0")?,
                get: sym(&lib, b"PMIx_Get\0")?,
                value_destruct: sym(&lib, b"PMIx_Value_destruct\0")?,
                error_string: sym(&lib, b"PMIx_Error_string\0")?,
                _lib: lib,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The numbers come from compiling, once by hand on Debian 12 x86_64
    /// with libpmix-dev 4.2.2,
    /// `cc -I/usr/lib/x86_64-linux-gnu/pmix2/include layout.c` where
    /// layout.c `#include <pmix.h>` and prints `sizeof`, `_Alignof` and
    /// `offsetof` of the structs and fields below. It printed:
    /// pmix_proc_t 260 (align 4, rank at 256); pmix_value_t 32 (align 8,
    /// data at 8, sizeof data 24); pmix_info_t 552 (align 8, flags at 512,
    /// value at 520); pmix_byte_object_t 16; PMIX_RANK_WILDCARD 4294967294.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn layouts_match_the_c_headers() {
        assert_eq!(size_of::<Proc>(), 260);
        assert_eq!(align_of::<Proc>(), 4);
        assert_eq!(offset_of!(Proc, rank), 256);

        assert_eq!(size_of::<ValueData>(), 24);
        assert_eq!(size_of::<Value>(), 32);
        assert_eq!(align_of::<Value>(), 8);
        assert_eq!(offset_of!(Value, data), 8);

        assert_eq!(size_of::<Info>(), 552);
        assert_eq!(align_of::<Info>(), 8);
        assert_eq!(offset_of!(Info, flags), 512);
        assert_eq!(offset_of!(Info, value), 520);

        assert_eq!(size_of::<ByteObject>(), 16);
        assert_eq!(RANK_WILDCARD, 4_294_967_294);
    }

    #[test]
    fn bool_info_carries_key_and_flag() {
        let info = Info::new_bool(COLLECT_DATA, true);
        let key: Vec<u8> = info.key.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        assert_eq!(key, b"pmix.collect");
        assert_eq!(info.value.type_, BOOL);
        // SAFETY: `new_bool` wrote `flag`, and the rest of the union is zero.
        assert!(unsafe { info.value.data.flag });
    }

    #[test]
    fn open_reports_every_candidate() {
        let err = match Api::open(&["/nonexistent/libpmix-a.so".into(), "/nonexistent/libpmix-b.so".into()]) {
            Ok(_) => panic!("a nonexistent path loaded"),
            Err(e) => e,
        };
        assert!(err.contains("/nonexistent/libpmix-a.so"), "{err}");
        assert!(err.contains("/nonexistent/libpmix-b.so"), "{err}");
    }
}
