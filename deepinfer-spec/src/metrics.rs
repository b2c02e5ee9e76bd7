//! Calibration metrics of binary predictions: expected calibration error, Brier score, AUROC.

/// Expected calibration error with `bins` equal-width bins over `[0, 1]`: the count-weighted
/// mean of `|mean prediction − observed rate|` per bin. 0 for empty input.
pub fn ece(predictions: &[f64], labels: &[bool], bins: usize) -> f64 {
    let bins = bins.max(1);
    let n = predictions.len().min(labels.len());
    if n == 0 {
        return 0.0;
    }
    let mut sum_p = vec![0.0f64; bins];
    let mut sum_y = vec![0.0f64; bins];
    for (&p, &y) in predictions.iter().zip(labels) {
        let b = ((p * bins as f64) as usize).min(bins - 1);
        sum_p[b] += p;
        sum_y[b] += f64::from(u8::from(y));
    }
    sum_p
        .iter()
        .zip(&sum_y)
        .map(|(sp, sy)| (sp - sy).abs())
        .sum::<f64>()
        / n as f64
}

/// Brier score: mean squared error between prediction and outcome. 0 for empty input.
pub fn brier(predictions: &[f64], labels: &[bool]) -> f64 {
    let n = predictions.len().min(labels.len());
    if n == 0 {
        return 0.0;
    }
    predictions
        .iter()
        .zip(labels)
        .map(|(&p, &y)| {
            let d = p - f64::from(u8::from(y));
            d * d
        })
        .sum::<f64>()
        / n as f64
}

/// Area under the ROC curve (probability that a random positive is ranked above a random
/// negative, ties counting one half), via the Mann–Whitney rank sum. `None` when one class is
/// absent.
pub fn auroc(predictions: &[f64], labels: &[bool]) -> Option<f64> {
    let n = predictions.len().min(labels.len());
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_unstable_by(|&a, &b| predictions[a].total_cmp(&predictions[b]));
    let (mut rank_sum_pos, mut n_pos) = (0.0f64, 0usize);
    let mut start = 0;
    while start < n {
        let mut end = start + 1;
        while end < n && predictions[idx[end]] == predictions[idx[start]] {
            end += 1;
        }
        // Ranks start..end (1-based: start+1..=end) share their average.
        let avg = (start + 1 + end) as f64 / 2.0;
        for &i in &idx[start..end] {
            if labels[i] {
                rank_sum_pos += avg;
                n_pos += 1;
            }
        }
        start = end;
    }
    let n_neg = n - n_pos;
    if n_pos == 0 || n_neg == 0 {
        return None;
    }
    let np = n_pos as f64;
    Some((rank_sum_pos - np * (np + 1.0) / 2.0) / (np * n_neg as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ece_by_hand() {
        // Bin [0.8, 0.9): predictions 0.8, 0.8, outcomes 1, 0 → |1.6 − 1| = 0.6;
        // bin [0.2, 0.3): 0.2, outcome 0 → 0.2. ECE = 0.8 / 3.
        let e = ece(&[0.8, 0.8, 0.2], &[true, false, false], 10);
        assert!((e - 0.8 / 3.0).abs() < 1e-12);
        assert_eq!(ece(&[1.0, 0.0], &[true, false], 10), 0.0);
        assert_eq!(ece(&[], &[], 10), 0.0);
    }

    #[test]
    fn brier_by_hand() {
        let b = brier(&[0.8, 0.8, 0.2], &[true, false, false]);
        assert!((b - (0.04 + 0.64 + 0.04) / 3.0).abs() < 1e-12);
    }

    #[test]
    fn auroc_by_hand() {
        assert_eq!(
            auroc(&[0.1, 0.4, 0.35, 0.8], &[false, false, true, true]),
            Some(0.75)
        );
        assert_eq!(auroc(&[0.5, 0.5], &[true, false]), Some(0.5));
        assert_eq!(auroc(&[0.9, 0.1], &[true, false]), Some(1.0));
        assert_eq!(auroc(&[0.9, 0.1], &[true, true]), None);
    }
}
