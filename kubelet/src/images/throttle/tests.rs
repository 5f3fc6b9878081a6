//! The bucket's arithmetic on tokio's paused clock (no real sleeps).

use super::*;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn burst_then_one_pull_per_qps_interval() {
    let t = PullThrottle::new(5, 10);
    for i in 0..10 {
        assert!(t.try_accept(), "pull {i} of the burst");
    }
    assert!(!t.try_accept(), "the 11th pull at once finds no token");
    // 5 a second: one token every 200 ms.
    tokio::time::advance(Duration::from_millis(199)).await;
    assert!(!t.try_accept());
    tokio::time::advance(Duration::from_millis(2)).await;
    assert!(t.try_accept());
    assert!(!t.try_accept());
    // A long pause refills up to the burst, not beyond.
    tokio::time::advance(Duration::from_secs(3600)).await;
    let got = (0..20).filter(|_| t.try_accept()).count();
    assert_eq!(got, 10);
}

#[tokio::test(start_paused = true)]
async fn zero_qps_means_no_limit_and_zero_burst_refuses_everything() {
    let unlimited = PullThrottle::new(0, 0);
    assert!((0..1000).all(|_| unlimited.try_accept()));
    let closed = PullThrottle::new(5, 0);
    assert!(!closed.try_accept());
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(
        !closed.try_accept(),
        "a 0-token bucket never lets a pull through"
    );
}
