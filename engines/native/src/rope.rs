//! Rotary position embeddings as `transformers` computes them (`modeling_rope_utils.py`): the
//! inverse frequencies of each variant, and the rotation in the "rotate half" layout (element `i`
//! pairs with `i + head_dim / 2`), which is how Hugging Face checkpoints store q and k.

use serde_json::Value;

/// `rope_scaling` of config.json.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.x: low frequencies scaled, high kept, a smooth band between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: f32,
    },
    /// YaRN: interpolation blended with extrapolation per frequency, and an attention factor on
    /// cos/sin.
    Yarn {
        factor: f32,
        original_context: f32,
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
        truncate: bool,
    },
}

impl RopeScaling {
    pub fn parse(value: Option<&Value>, context_length: usize) -> Result<Self, String> {
        let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(Self::None) };
        let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(Value::as_str).unwrap_or("default");
        let num = |key: &str| v.get(key).and_then(Value::as_f64).map(|x| x as f32);
        let factor =
            || num("factor").filter(|f| *f > 0.0).ok_or(format!("rope_scaling ({kind}) needs a positive factor"));
        let original = num("original_max_position_embeddings").unwrap_or(context_length as f32);
        match kind {
            "default" => Ok(Self::None),
            "linear" => Ok(Self::Linear { factor: factor()? }),
            "llama3" => Ok(Self::Llama3 {
                factor: factor()?,
                low_freq_factor: num("low_freq_factor").unwrap_or(1.0),
                high_freq_factor: num("high_freq_factor").unwrap_or(4.0),
                original_context: original,
            }),
            "yarn" => {
                let factor = factor()?;
                Ok(Self::Yarn {
                    factor,
                    original_context: original,
                    beta_fast: num("beta_fast").unwrap_or(32.0),
                    beta_slow: num("beta_slow").unwrap_or(1.0),
                    attention_factor: num("attention_factor").unwrap_or(if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * factor.ln() + 1.0
                    }),
                    truncate: v.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                })
            }
            other => Err(format!("rope_scaling type '{other}' is not supported (linear, llama3, yarn)")),
        }
    }
}

/// Precomputed rotation for one head size: inverse frequencies and the factor on cos/sin.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
    attention_factor: f32,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Self {
        let half = head_dim / 2;
        let base: Vec<f64> = (0..half).map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64)).collect();
        let mut attention_factor = 1.0;
        let inv_freq: Vec<f64> = match *scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor as f64).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                let (factor, low, high, old) =
                    (factor as f64, low_freq_factor as f64, high_freq_factor as f64, original_context as f64);
                let low_wavelen = old / low;
                let high_wavelen = old / high;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen > low_wavelen {
                            f / factor
                        } else if wavelen < high_wavelen {
                            f
                        } else {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor: af, truncate } => {
                attention_factor = af;
                let (dim, theta, old) = (head_dim as f64, theta as f64, original_context as f64);
                let correction =
                    |rotations: f64| dim * (old / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
                let (mut low, mut high) = (correction(beta_fast as f64), correction(beta_slow as f64));
                if truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let high = high.min(dim - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                base.iter()
                    .enumerate()
                    .map(|(i, &extrapolated)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let keep_extrapolated = 1.0 - ramp;
                        let interpolated = extrapolated / factor as f64;
                        interpolated * (1.0 - keep_extrapolated) + extrapolated * keep_extrapolated
                    })
                    .collect()
            }
        };
        Rope { inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(), attention_factor }
    }

    /// The inverse frequency of each rotated pair (`head_dim / 2`).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// The factor on cos and sin (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        self.attention_factor
    }

    /// Rotates every head of `x` (`heads x head_dim`, contiguous) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        self.apply_all(&mut [x], head_dim, pos);
    }

    /// [`Self::apply`] on each of `xs` (a token's queries and keys), the angles taken once.
    pub fn apply_all(&self, xs: &mut [&mut [f32]], head_dim: usize, pos: usize) {
        let half = head_dim / 2;
        // As transformers does: the angle is an f32 product, cos/sin are taken in f32.
        let mut cos = [0f32; 256];
        let mut sin = [0f32; 256];
        assert!(half <= cos.len(), "head_dim {head_dim} is larger than the engine supports");
        for i in 0..half {
            let angle = pos as f32 * self.inv_freq[i];
            cos[i] = angle.cos() * self.attention_factor;
            sin[i] = angle.sin() * self.attention_factor;
        }
        for head in xs.iter_mut().flat_map(|x| x.chunks_exact_mut(head_dim)) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_the_identity_and_rotation_keeps_the_norm() {
        let rope = Rope::new(8, 10_000.0, &RopeScaling::None);
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.7).collect();
        let mut y = x.clone();
        rope.apply(&mut y, 8, 0);
        assert_eq!(x, y);
        rope.apply(&mut y, 8, 37);
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(&x[..8]) - norm(&y[..8])).abs() < 1e-4);
        assert_ne!(x, y);
    }

    /// A token's queries and keys rotated together get the bits each gets rotated alone.
    #[test]
    fn rotating_queries_and_keys_together_is_rotating_each() {
        let rope = Rope::new(16, 10_000.0, &RopeScaling::Linear { factor: 2.0 });
        let q: Vec<f32> = (0..48).map(|i| (i as f32 * 0.61).cos()).collect();
        let k: Vec<f32> = (0..32).map(|i| (i as f32 * 0.29).sin() - 0.2).collect();
        let (mut q1, mut k1, mut q2, mut k2) = (q.clone(), k.clone(), q.clone(), k);
        rope.apply(&mut q1, 16, 1234);
        rope.apply(&mut k1, 16, 1234);
        rope.apply_all(&mut [&mut q2, &mut k2], 16, 1234);
        assert_eq!((q1, k1), (q2, k2));
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        let scaling =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192.0 };
        let plain = Rope::new(128, 500_000.0, &RopeScaling::None);
        let scaled = Rope::new(128, 500_000.0, &scaling);
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((plain.inv_freq[last] / 8.0 - scaled.inv_freq[last]).abs() < 1e-12);
    }

    #[test]
    fn yarn_parses_with_its_defaults_and_scales_attention() {
        let v: Value =
            serde_json::json!({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096});
        let s = RopeScaling::parse(Some(&v), 131072).unwrap();
        let RopeScaling::Yarn { attention_factor, beta_fast, .. } = s else { panic!("{s:?}") };
        assert!((attention_factor - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
        assert_eq!(beta_fast, 32.0);
        let e = RopeScaling::parse(Some(&serde_json::json!({"type": "dynamic", "factor": 2.0})), 4096).unwrap_err();
        assert!(e.contains("dynamic"), "{e}");
    }
}
