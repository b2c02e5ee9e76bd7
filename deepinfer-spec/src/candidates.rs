//! Draft candidates as sortable keys: the running product of confidences packed with the
//! request and position, so one integer sort orders the whole batch.
//!
//! Key layout (`u128`, sorted ascending): the high 64 bits are the bitwise complement of the
//! running product's IEEE bits (for non-negative floats the bit pattern is monotone in the value,
//! so complementing sorts larger products first); then 32 bits of request index and 32 bits of
//! draft position. Ties in the product therefore break by (request, position) ascending, which
//! keeps every request's selection a prefix of its drafts: along one request the product never
//! grows, and among equal products the earlier position sorts first.

use crate::error::SpecError;

/// Packs one candidate.
#[inline]
pub(crate) fn key(product: f64, request: usize, position: usize) -> u128 {
    // `+ 0.0` turns a possible -0.0 into +0.0 so the bit trick stays monotone.
    let bits = (product + 0.0).to_bits();
    ((!bits as u128) << 64) | ((request as u128) << 32) | position as u128
}

/// The running product stored in a key.
#[inline]
pub(crate) fn product(key: u128) -> f64 {
    f64::from_bits(!((key >> 64) as u64))
}

/// The request index stored in a key.
#[inline]
pub(crate) fn request(key: u128) -> usize {
    ((key >> 32) as u32) as usize
}

/// Checks one confidence.
#[inline]
pub(crate) fn check(request: usize, position: usize, value: f64) -> Result<(), SpecError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(SpecError::InvalidConfidence {
            request,
            position,
            value,
        })
    }
}

/// Validates every confidence and appends one key per draft (at most `max_drafts` per request)
/// to `keys`, which is cleared first.
pub(crate) fn build<C: AsRef<[f64]>>(
    requests: &[C],
    max_drafts: usize,
    keys: &mut Vec<u128>,
) -> Result<(), SpecError> {
    if requests.is_empty() {
        return Err(SpecError::EmptyBatch);
    }
    if requests.len() > u32::MAX as usize {
        return Err(SpecError::BatchTooLarge {
            requests: requests.len(),
            max: u32::MAX as usize,
        });
    }
    keys.clear();
    for (r, confs) in requests.iter().enumerate() {
        let confs = confs.as_ref();
        let mut a = 1.0f64;
        for (i, &c) in confs.iter().enumerate() {
            check(r, i, c)?;
            if i < max_drafts {
                a *= c;
                keys.push(key(a, r, i));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_by_product_then_request_then_position() {
        let mut ks = [
            key(0.5, 0, 1),
            key(0.9, 1, 0),
            key(0.5, 0, 0),
            key(0.0, 0, 2),
            key(-0.0, 1, 1),
            key(1.0, 2, 0),
        ];
        ks.sort_unstable();
        let got: Vec<(f64, usize)> = ks.iter().map(|&k| (product(k), request(k))).collect();
        assert_eq!(
            got,
            [(1.0, 2), (0.9, 1), (0.5, 0), (0.5, 0), (0.0, 0), (0.0, 1)]
        );
        assert_eq!(ks[2] as u32, 0);
        assert_eq!(ks[3] as u32, 1);
    }
}
