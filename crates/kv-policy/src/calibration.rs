//! What the staged KV cache costs one model in quality, as a table the evaluator measures
//! (`kv-eval --calibrate`) and engines read at load, so that the control API's
//! `delta_ppl_est` is an estimate from that model's own measurements rather than a guess.
//!
//! The estimate is linear in the share of KV positions at each level:
//! `delta_ppl_est = int8 * s_int8 + int4 * s_int4 + evicted * s_evicted` (relative delta-PPL,
//! in percent), where `s_level` is the share of the positions held that are at that level and
//! each cost is what the whole cache at that level would cost. The static int8 and int4 runs
//! give the first two directly (delta over share); eviction's cost is fitted, non-negative, by
//! least squares to the dynamic profiles' runs under memory pressure (which mix levels and evict
//! the least important blocks, as serving does), after what int8 and int4 explain of them. It
//! is an estimate: eviction's cost depends on which
//! blocks go, and the runs are prose at one context length.
//!
//! The table lives in the model's folder as [`FILE_NAME`], a dot-file the model store skips as
//! tool state: it belongs to one copy of one model, on the machine that measured it.

use serde::{Deserialize, Serialize};
use std::path::Path;

pub const FILE_NAME: &str = ".llmr-kv-calibration.json";

/// Relative delta-PPL (percent) of a cache wholly at each level below f16.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelCosts {
    pub int8: f64,
    pub int4: f64,
    pub evicted: f64,
}

/// One evaluator run: KV positions per level at its end (f16, int8, int4, evicted) and the
/// relative delta-PPL (percent) it measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationPoint {
    /// What ran (`static int8`, `balanced at 0.25 of the f16 budget`, ...).
    pub run: String,
    pub levels: [u64; 4],
    pub delta_ppl_pct: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// What was measured: the model folder's name, the text, its length in tokens.
    pub model: String,
    pub corpus: String,
    pub ctx: usize,
    /// The share the native engine's recall of evicted blocks ran at in the runs
    /// (`kv-eval --calibrate --recall`); `None`: evicted blocks were gone. Recall makes
    /// eviction cheaper, so a table is for the one setting it was measured with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<f32>,
    pub cost: LevelCosts,
    pub points: Vec<CalibrationPoint>,
}

impl Calibration {
    /// Fits the costs to `points` (at least one with positions below f16).
    pub fn fit(model: String, corpus: String, ctx: usize, points: Vec<CalibrationPoint>) -> Result<Self, String> {
        let rows: Vec<([f64; 3], f64)> =
            points.iter().filter_map(|p| Some((shares(p.levels)?, p.delta_ppl_pct))).collect();
        if !rows.iter().any(|(s, _)| s.iter().any(|&v| v > 0.0)) {
            return Err("no run held positions below f16: nothing to fit".into());
        }
        // A run with one level below f16 (a static run) measures that level's cost directly:
        // cost = delta / share, averaged over such runs. The mixed runs must not move it (their
        // noise would: a -0.1% run pulls a small int4 cost to 0).
        let mut pinned: [Option<f64>; 3] = [None; 3];
        for level in 0..3 {
            let pure: Vec<f64> = rows
                .iter()
                .filter(|(s, _)| s[level] > 0.0 && (0..3).all(|o| o == level || s[o] == 0.0))
                .map(|(s, d)| d / s[level])
                .collect();
            if !pure.is_empty() {
                pinned[level] = Some((pure.iter().sum::<f64>() / pure.len() as f64).max(0.0));
            }
        }
        // The other levels (eviction, which only the dynamic runs hold): least squares on what
        // the pinned costs leave unexplained, with their columns out of the fit.
        let residual_rows: Vec<([f64; 3], f64)> = rows
            .iter()
            .map(|(s, d)| {
                let known: f64 = (0..3).filter_map(|l| pinned[l].map(|c| c * s[l])).sum();
                let free = [0, 1, 2].map(|l| if pinned[l].is_some() { 0.0 } else { s[l] });
                (free, d - known)
            })
            .collect();
        let fitted = nonnegative_least_squares(&residual_rows);
        let [int8, int4, evicted] = [0, 1, 2].map(|l| pinned[l].unwrap_or(fitted[l]));
        Ok(Calibration { model, corpus, ctx, recall: None, cost: LevelCosts { int8, int4, evicted }, points })
    }

    /// The relative delta-PPL (percent) of a cache holding `levels` positions per level (f16,
    /// int8, int4, evicted); 0 for an empty cache.
    pub fn estimate(&self, levels: [u64; 4]) -> f64 {
        shares(levels).map_or(0.0, |[s8, s4, se]| self.cost.int8 * s8 + self.cost.int4 * s4 + self.cost.evicted * se)
    }

    /// The table of the model in `dir`, `None` where there is none.
    pub fn read(dir: &Path) -> Result<Option<Self>, String> {
        let path = dir.join(FILE_NAME);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let c: Calibration = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let costs = [c.cost.int8, c.cost.int4, c.cost.evicted];
        if !costs.iter().all(|v| v.is_finite() && *v >= 0.0) {
            return Err(format!("{}: costs must be finite and not negative", path.display()));
        }
        Ok(Some(c))
    }

    /// Writes the table into `dir` whole or not at all (a temporary file renamed over it).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let tmp = dir.join(format!("{FILE_NAME}.{}.tmp", std::process::id()));
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text + "\n")?;
        std::fs::rename(&tmp, dir.join(FILE_NAME)).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

/// Shares of the positions at int8, int4 and evicted; `None` for no positions.
fn shares(levels: [u64; 4]) -> Option<[f64; 3]> {
    let total: u64 = levels.iter().sum();
    (total > 0).then(|| [1, 2, 3].map(|l| levels[l] as f64 / total as f64))
}

/// `argmin |A c - b|` over `c >= 0` for three unknowns: the unconstrained least squares of every
/// subset of the unknowns (the others held at 0), the best whose solution is not negative. With
/// three unknowns the eight subsets are the whole active-set search.
fn nonnegative_least_squares(rows: &[([f64; 3], f64)]) -> [f64; 3] {
    let residual =
        |c: &[f64; 3]| -> f64 { rows.iter().map(|(a, b)| (a[0] * c[0] + a[1] * c[1] + a[2] * c[2] - b).powi(2)).sum() };
    let mut best = ([0.0; 3], residual(&[0.0; 3]));
    for subset in 1u32..8 {
        let vars: Vec<usize> = (0..3).filter(|v| subset & (1 << v) != 0).collect();
        let Some(solution) = solve_normal_equations(rows, &vars) else { continue };
        let mut c = [0.0; 3];
        for (&v, x) in vars.iter().zip(solution) {
            c[v] = x;
        }
        if c.iter().all(|&x| x >= 0.0) {
            let r = residual(&c);
            if r < best.1 - 1e-15 {
                best = (c, r);
            }
        }
    }
    best.0
}

/// The least-squares solution for the columns `vars` of `rows` (Gaussian elimination on the
/// normal equations); `None` where they do not determine it (a level no run held).
fn solve_normal_equations(rows: &[([f64; 3], f64)], vars: &[usize]) -> Option<Vec<f64>> {
    let n = vars.len();
    // [A^T A | A^T b]
    let mut m: Vec<Vec<f64>> = vars
        .iter()
        .map(|&i| {
            let mut row: Vec<f64> = vars.iter().map(|&j| rows.iter().map(|(a, _)| a[i] * a[j]).sum()).collect();
            row.push(rows.iter().map(|(a, b)| a[i] * b).sum());
            row
        })
        .collect();
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        for r in 0..n {
            if r != col {
                let f = m[r][col] / m[col][col];
                let pivot_row = m[col].clone();
                for (v, p) in m[r].iter_mut().zip(&pivot_row).skip(col) {
                    *v -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(levels: [u64; 4], delta_ppl_pct: f64) -> CalibrationPoint {
        CalibrationPoint { run: String::new(), levels, delta_ppl_pct }
    }

    #[test]
    fn the_fit_recovers_the_costs_that_made_the_points() {
        let truth = LevelCosts { int8: 0.05, int4: 0.4, evicted: 6.0 };
        let make = |levels: [u64; 4]| {
            let c = Calibration {
                model: String::new(),
                corpus: String::new(),
                ctx: 0,
                recall: None,
                cost: truth,
                points: vec![],
            };
            point(levels, c.estimate(levels))
        };
        let points = vec![
            make([4, 96, 0, 0]),
            make([4, 0, 96, 0]),
            make([10, 30, 40, 20]),
            make([4, 0, 60, 36]),
            make([50, 50, 0, 0]),
        ];
        let c = Calibration::fit("m".into(), "t".into(), 2048, points).unwrap();
        for (got, want) in [(c.cost.int8, truth.int8), (c.cost.int4, truth.int4), (c.cost.evicted, truth.evicted)] {
            assert!((got - want).abs() < 1e-9, "{:?}", c.cost);
        }
        // Half the positions int4, a quarter evicted: 0.5 * 0.4 + 0.25 * 6.
        assert!((c.estimate([25, 0, 50, 25]) - 1.7).abs() < 1e-9);
        assert_eq!(c.estimate([0; 4]), 0.0);
        assert_eq!(c.estimate([7, 0, 0, 0]), 0.0, "an f16 cache costs nothing");
    }

    #[test]
    fn noise_below_zero_fits_a_zero_cost_not_a_negative_one() {
        // int8 measured at -0.04% (noise), int4 at +0.5%: int8 costs 0, not less.
        // A mixed run below zero moves neither the static runs' costs nor eviction's below 0.
        let points = vec![point([4, 96, 0, 0], -0.04), point([4, 0, 96, 0], 0.5), point([10, 30, 40, 20], -0.2)];
        let c = Calibration::fit("m".into(), "t".into(), 2048, points).unwrap();
        assert_eq!(c.cost.int8, 0.0);
        assert!((c.cost.int4 - 0.5 / 0.96).abs() < 1e-9, "{:?}", c.cost);
        assert_eq!(c.cost.evicted, 0.0);
        // No run evicted at all: its cost is undetermined and left at 0.
        let c = Calibration::fit("m".into(), "t".into(), 2048, vec![point([4, 96, 0, 0], 0.1)]).unwrap();
        assert_eq!(c.cost.evicted, 0.0);
    }

    #[test]
    fn a_table_without_a_level_below_f16_is_refused() {
        let err = Calibration::fit("m".into(), "t".into(), 2048, vec![point([9, 0, 0, 0], 0.0)]).unwrap_err();
        assert!(err.contains("nothing to fit"), "{err}");
    }

    #[test]
    fn a_table_is_written_whole_and_read_back_and_a_bad_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("llmr-kv-calibration-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(Calibration::read(&dir).unwrap(), None, "no table: none, not an error");
        let c = Calibration::fit("m".into(), "hamlet".into(), 2048, vec![point([4, 96, 0, 0], 0.2)]).unwrap();
        c.write(&dir).unwrap();
        let back = Calibration::read(&dir).unwrap().unwrap();
        // serde_json's float parsing may move the last bit.
        assert!((back.cost.int8 - c.cost.int8).abs() < 1e-12 && back.cost.int8 > 0.0, "{back:?}");
        assert_eq!((&back.points, back.ctx, &back.corpus), (&c.points, c.ctx, &c.corpus));
        assert_eq!(back.recall, None);
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [FILE_NAME], "no temporary file is left");
        // A table measured with recall says so; one written before the field reads as without.
        Calibration { recall: Some(0.05), ..c.clone() }.write(&dir).unwrap();
        assert_eq!(Calibration::read(&dir).unwrap().unwrap().recall, Some(0.05));
        let older = r#"{"model":"m","corpus":"t","ctx":1,"cost":{"int8":0,"int4":0,"evicted":1},"points":[]}"#;
        std::fs::write(dir.join(FILE_NAME), older).unwrap();
        assert_eq!(Calibration::read(&dir).unwrap().unwrap().recall, None);
        std::fs::write(dir.join(FILE_NAME), r#"{"model": "m"}"#).unwrap();
        assert!(Calibration::read(&dir).unwrap_err().contains("missing field"));
        let negative = r#"{"model":"m","corpus":"t","ctx":1,"cost":{"int8":-1,"int4":0,"evicted":0},"points":[]}"#;
        std::fs::write(dir.join(FILE_NAME), negative).unwrap();
        assert!(Calibration::read(&dir).unwrap_err().contains("not negative"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
