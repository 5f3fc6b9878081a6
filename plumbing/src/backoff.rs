//! The kubelet's one exponential back-off: `initial`, doubling up to `max`, back to `initial`
//! after a success, or, with [`Backoff::reset_after`], once that long has passed quietly since
//! the last failure (upstream's flowcontrol.Backoff and its GC of idle entries).

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    reset_after: Option<Duration>,
    last_failure: Option<Instant>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            next: initial.min(max),
            reset_after: None,
            last_failure: None,
        }
    }

    /// After `quiet` without a failure, the next failure waits `initial` again.
    pub fn reset_after(mut self, quiet: Duration) -> Self {
        self.reset_after = Some(quiet);
        self
    }

    /// A failure now: the delay to wait before trying again. The next one doubles (capped).
    pub fn fail(&mut self) -> Duration {
        self.fail_at(Instant::now())
    }

    /// [`Backoff::fail`] at a given instant (tests, or a caller that already read the clock).
    pub fn fail_at(&mut self, now: Instant) -> Duration {
        if let (Some(quiet), Some(last)) = (self.reset_after, self.last_failure)
            && now.saturating_duration_since(last) >= quiet
        {
            self.next = self.initial.min(self.max);
        }
        let delay = self.next;
        self.next = delay.saturating_mul(2).min(self.max);
        self.last_failure = Some(now);
        delay
    }

    /// A success: the next failure waits `initial` again.
    pub fn succeed(&mut self) {
        self.next = self.initial.min(self.max);
        self.last_failure = None;
    }

    /// The delay the next failure will get.
    pub fn peek(&self) -> Duration {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), s(5));
        let got: Vec<_> = (0..5).map(|_| b.fail()).collect();
        assert_eq!(got, [s(1), s(2), s(4), s(5), s(5)]);
        b.succeed();
        assert_eq!(b.fail(), s(1));
        // Never overflows, whatever the count.
        let mut b = Backoff::new(s(1), Duration::MAX);
        for _ in 0..200 {
            b.fail();
        }
        assert_eq!(b.peek(), Duration::MAX);
    }

    #[test]
    fn quiet_time_resets() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        let mut b = Backoff::new(s(10), s(300)).reset_after(s(600));
        assert_eq!(b.fail_at(t0), s(10));
        assert_eq!(b.fail_at(t0 + s(20)), s(20));
        assert_eq!(b.fail_at(t0 + s(30)), s(40));
        assert_eq!(b.fail_at(t0 + s(30 + 600)), s(10), "quiet for 10 min");
    }
}
