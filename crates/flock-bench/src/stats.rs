//! Small statistics over samples.

/// The `q` quantile (0..=1) of sorted samples by nearest rank; NaN if empty.
pub fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

/// The median of values, ignoring NaN; NaN if none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Nanoseconds to microseconds.
pub fn us(ns: f64) -> f64 {
    ns / 1e3
}

/// Latency quantiles (p50, p99, max) in microseconds of unsorted samples in nanoseconds.
pub fn latency_us(mut samples: Vec<u64>) -> [f64; 3] {
    samples.sort_unstable();
    [0.5, 0.99, 1.0].map(|q| us(quantile(&samples, q)))
}
