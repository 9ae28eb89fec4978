use std::hint::black_box;
use std::time::Duration;
use turnstile::{KeyedTokenBucket, Limit, Nanos};
fn main() {
    let fh = foldhash::fast::RandomState::default();
    let k = KeyedTokenBucket::builder(Limit::per_second(1e9).unwrap(), u32::MAX)
        .hasher(fh)
        .sweep_every(Duration::MAX)
        .build()
        .unwrap();
    let mut t = 1u64;
    for _ in 0..100_000_000u64 {
        t += 1;
        black_box(k.check_n_at(black_box(&7u64), Nanos::new(t), 1)).ok();
    }
}
