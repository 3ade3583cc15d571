//! Time as the core sees it: nanoseconds on a clock chosen by the driver.
//! The core never reads a clock; every input carries `now`.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since an origin chosen by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);

    pub fn from_nanos(n: u64) -> Time {
        Time(n)
    }
    pub fn as_nanos(self) -> u64 {
        self.0
    }
    /// Time elapsed since `earlier`, zero if `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, rhs: Time) -> Duration {
        self.since(rhs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn arithmetic_saturates() {
        let t = Time(10);
        assert_eq!(t + Duration::from_nanos(5), Time(15));
        assert_eq!(Time(3) - Time(10), Duration::ZERO);
        assert_eq!(Time(u64::MAX) + Duration::from_secs(1), Time(u64::MAX));
    }
}
