//! The percentiles the benchmarks print: by nearest rank, over samples
//! sorted in advance.

/// The `p` quantile of `sorted` (its element at rank `len × p`, the last at
/// most); `None` when there are none.
pub fn nearest<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[((sorted.len() as f64 * p) as usize).min(last)])
}
