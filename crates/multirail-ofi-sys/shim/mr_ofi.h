/*
 * mr_ofi: out-of-line wrappers over libfabric's static-inline calls.
 *
 * libfabric's headers define most of the API (fi_domain, fi_endpoint,
 * fi_send, fi_cq_read...) as `static inline` functions that jump through
 * the ops tables of the object they are given. Rust cannot call those, so
 * each one used by multirail gets a real function here with the same
 * arguments, named mr_ofi_<call>. The calls that libfabric exports as real
 * symbols (fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric, fi_strerror,
 * fi_tostr, fi_version) are bound directly and are not wrapped.
 *
 * This header is also bindgen's input (see the crate README): keep it
 * self-contained and C-only.
 */
#ifndef MR_OFI_H
#define MR_OFI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

/* Values that are macros bindgen cannot evaluate (casts, function-like). */
uint32_t mr_ofi_header_version(void); /* FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) */
uint64_t mr_ofi_addr_unspec(void);    /* FI_ADDR_UNSPEC */

/* fi_info */
struct fi_info *mr_ofi_allocinfo(void);

/* objects */
int mr_ofi_close(struct fid *fid);
int mr_ofi_domain(struct fid_fabric *fabric, struct fi_info *info,
                  struct fid_domain **domain, void *context);
int mr_ofi_endpoint(struct fid_domain *domain, struct fi_info *info,
                    struct fid_ep **ep, void *context);
int mr_ofi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
                   struct fid_cq **cq, void *context);
int mr_ofi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
                   struct fid_av **av, void *context);
int mr_ofi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int mr_ofi_enable(struct fid_ep *ep);
int mr_ofi_getname(struct fid *fid, void *addr, size_t *addrlen);
int mr_ofi_setname(struct fid *fid, void *addr, size_t addrlen);

/* address vectors */
int mr_ofi_av_insert(struct fid_av *av, const void *addr, size_t count,
                     fi_addr_t *fi_addr, uint64_t flags, void *context);
int mr_ofi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
                     uint64_t flags);

/* memory registration */
int mr_ofi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
                  uint64_t access, uint64_t offset, uint64_t requested_key,
                  uint64_t flags, struct fid_mr **mr, void *context);
void *mr_ofi_mr_desc(struct fid_mr *mr);
uint64_t mr_ofi_mr_key(struct fid_mr *mr);
int mr_ofi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int mr_ofi_mr_enable(struct fid_mr *mr);

/* messages */
ssize_t mr_ofi_send(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                    fi_addr_t dest_addr, void *context);
ssize_t mr_ofi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                    fi_addr_t src_addr, void *context);
ssize_t mr_ofi_inject(struct fid_ep *ep, const void *buf, size_t len,
                      fi_addr_t dest_addr);

/* tagged messages */
ssize_t mr_ofi_tsend(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                     fi_addr_t dest_addr, uint64_t tag, void *context);
ssize_t mr_ofi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                     fi_addr_t src_addr, uint64_t tag, uint64_t ignore,
                     void *context);
ssize_t mr_ofi_tinject(struct fid_ep *ep, const void *buf, size_t len,
                       fi_addr_t dest_addr, uint64_t tag);

/* RMA */
ssize_t mr_ofi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
                    fi_addr_t src_addr, uint64_t addr, uint64_t key,
                    void *context);
ssize_t mr_ofi_write(struct fid_ep *ep, const void *buf, size_t len, void *desc,
                     fi_addr_t dest_addr, uint64_t addr, uint64_t key,
                     void *context);

/* completion queues */
ssize_t mr_ofi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t mr_ofi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
                          uint64_t flags);
const char *mr_ofi_cq_strerror(struct fid_cq *cq, int prov_errno,
                               const void *err_data, char *buf, size_t len);

/* wait objects (declared by hand in lib.rs until bindings.rs is
 * regenerated: see the `extra` module there) */
int mr_ofi_control(struct fid *fid, int command, void *arg);
int mr_ofi_trywait(struct fid_fabric *fabric, struct fid **fids, int count);

/* cancellation */
ssize_t mr_ofi_cancel(struct fid *fid, void *context);

#endif /* MR_OFI_H */
