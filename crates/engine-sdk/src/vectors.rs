//! What every embedding engine does to its pooled vectors before handing them over.

/// Scales `v` to unit Euclidean length (OpenAI's embeddings are unit vectors); a zero vector
/// stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_out_of_unit_length_and_zero_stays_zero() {
        let mut v = [3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }
}
