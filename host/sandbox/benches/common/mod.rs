//! Timing helpers shared by the sandbox's benchmarks.

use std::time::{Duration, Instant};

/// The `p` quantile (0..=1) of `samples`, sorting them.
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

/// p50 and p99 of `iterations` runs of `f`, after a tenth as many (at most 200) warm-up runs.
pub fn measure(iterations: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..iterations.div_ceil(10).min(200) {
        f();
    }
    let mut samples: Vec<Duration> = (0..iterations)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    (percentile(&mut samples, 0.5), percentile(&mut samples, 0.99))
}

/// Microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
