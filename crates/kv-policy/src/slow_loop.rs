//! The slow loop's decision (spec 002, 4.1: "quantization profile switching, threshold
//! re-fit"): how a model under the dynamic policy should change to keep its estimated quality
//! cost (`delta_ppl_est`, from its calibration table) inside the run context's quality budget
//! while memory is short.
//!
//! The direction: over budget, safer; well inside it (under [`HEADROOM`] of it) while the cache
//! is past the policy's first pressure band, bolder; otherwise nothing. A move is first a re-fit
//! of the running profile's thresholds: all three shifted by [`STEP`] together from the ones the
//! re-fit started from (the profile's preset, or what `/v1/policy` set), at most [`RANGE`] either
//! way. Up puts more blocks below f16. A threshold of 0 (never: safe's eviction) stays 0, so a
//! profile keeps its promises. Past the range, or where a shift changes nothing, the profile
//! switches one step (aggressive, balanced, safe) and enters at the edge nearest the one it
//! left: a safer profile at its boldest re-fit, a bolder one at its safest. The three profiles
//! and the shifts within each make one ladder of small steps, on which the loop can settle inside
//! the budget. Profiles alone are coarse steps. The calibrated Qwen2.5's table prices balanced
//! at 0.25 of the f16 bytes at 0.83% and aggressive at 0.34 at 0.61%. With a budget between two
//! such steps, the loop would swing between the profiles on either side of it.
//!
//! A safer move stops further loss. In an engine that keeps f16 copies (the native engine's
//! spill tier), it also promotes the blocks the new thresholds put higher. Without copies, it
//! cannot undo what was already quantized or evicted, and the estimate falls only as those
//! blocks leave.

use crate::{KvPolicy, Profile, Thresholds};

/// The share of the quality budget under which a bolder step may be tried.
pub const HEADROOM: f64 = 0.5;
/// One re-fit step of the thresholds (importance is 0..1).
pub const STEP: f64 = 0.05;
/// The most the re-fit shifts a profile's thresholds either way (4 steps).
pub const RANGE: f64 = 0.2;
const MAX_STEPS: i32 = (RANGE / STEP + 0.5) as i32;

impl Profile {
    /// The next profile that stores more exactly (`None` from safe).
    pub fn safer(self) -> Option<Profile> {
        match self {
            Profile::Aggressive => Some(Profile::Balanced),
            Profile::Balanced => Some(Profile::Safe),
            Profile::Safe => None,
        }
    }

    /// The next profile that saves more memory (`None` from aggressive).
    pub fn bolder(self) -> Option<Profile> {
        match self {
            Profile::Safe => Some(Profile::Balanced),
            Profile::Balanced => Some(Profile::Aggressive),
            Profile::Aggressive => None,
        }
    }
}

/// Where the re-fit has taken one model's thresholds: the thresholds it started from and how
/// many steps up (bolder) or down (safer) it has shifted them. The loop keeps one per model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refit {
    pub base: Thresholds,
    pub steps: i32,
}

impl Refit {
    /// The re-fit of thresholds no step has moved yet.
    pub fn from(base: Thresholds) -> Refit {
        Refit { base, steps: 0 }
    }

    /// The thresholds it gives: each of the base's moved by the shift within 0..=1.01, except
    /// those at 0, which stay 0. One shift and one clamp for all keep their order. Rounded to
    /// 6 decimals, so that the API shows 0.9 rather than 0.8999999999999999.
    pub fn thresholds(&self) -> Thresholds {
        let shift = self.steps as f64 * STEP;
        let moved = |t: f64| if t == 0.0 { 0.0 } else { ((t + shift).clamp(0.0, 1.01) * 1e6).round() / 1e6 };
        Thresholds { int8: moved(self.base.int8), int4: moved(self.base.int4), evict: moved(self.base.evict) }
    }
}

/// What the slow loop changes in a model's policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Adjustment {
    /// New thresholds for the running profile (`{"level_thresholds": ...}`).
    Thresholds(Thresholds),
    /// Another profile with these thresholds (`{"profile": ..., "level_thresholds": ...}`).
    Profile(Profile, Thresholds),
}

impl Adjustment {
    /// The `kv_policy` patch that makes it.
    pub fn patch(&self) -> serde_json::Value {
        match self {
            Adjustment::Thresholds(t) => serde_json::json!({ "level_thresholds": t }),
            Adjustment::Profile(p, t) => serde_json::json!({ "profile": p, "level_thresholds": t }),
        }
    }
}

/// The change the slow loop makes to a model running `policy` (dynamic mode), if any:
/// `estimate` and `budget` are relative delta-PPL in percent, `pressure` the share of the KV
/// budget in use. `refit` is the model's re-fit, updated to what the change makes; where
/// `policy`'s thresholds are not the ones it gives (the first pass, or `/v1/policy` set others),
/// it starts again from `policy`'s.
pub fn adjust(policy: &KvPolicy, refit: &mut Refit, estimate: f64, budget: f64, pressure: f64) -> Option<Adjustment> {
    if refit.thresholds() != policy.level_thresholds {
        *refit = Refit::from(policy.level_thresholds);
    }
    if !(estimate.is_finite() && budget.is_finite()) {
        return None;
    }
    let up = if estimate > budget {
        false
    } else if estimate < budget * HEADROOM && pressure > policy.pressure.mid {
        true
    } else {
        return None;
    };
    let step = if up { 1 } else { -1 };
    let next = Refit { steps: refit.steps + step, ..*refit };
    if next.steps.abs() <= MAX_STEPS && next.thresholds() != policy.level_thresholds {
        *refit = next;
        return Some(Adjustment::Thresholds(next.thresholds()));
    }
    let profile = if up { policy.profile.bolder() } else { policy.profile.safer() }?;
    *refit = Refit { base: profile.preset().0, steps: -step * MAX_STEPS };
    Some(Adjustment::Profile(profile, refit.thresholds()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dynamic(profile: &str) -> KvPolicy {
        KvPolicy::baseline().patched_json(&json!({"mode": "dynamic", "profile": profile})).unwrap()
    }

    /// Runs `adjust` on `policy` with the same readings until it makes no change or `passes`
    /// ran, applying each change as the engine would; returns the policies it went through.
    fn walk(mut policy: KvPolicy, estimate: f64, budget: f64, pressure: f64, passes: usize) -> Vec<KvPolicy> {
        let mut refit = Refit::from(policy.level_thresholds);
        let mut seen = vec![policy];
        for _ in 0..passes {
            let Some(change) = adjust(&policy, &mut refit, estimate, budget, pressure) else { break };
            policy = policy.patched_json(&change.patch()).unwrap();
            assert_eq!(refit.thresholds(), policy.level_thresholds, "{change:?}");
            seen.push(policy);
        }
        seen
    }

    #[test]
    fn over_budget_shifts_the_thresholds_down_then_steps_to_a_safer_profile_down_to_safe() {
        let path = walk(dynamic("aggressive"), 0.8, 0.5, 0.9, 100);
        let profiles: Vec<Profile> = path.iter().map(|p| p.profile).collect();
        // Aggressive's four steps down, balanced entered at its boldest and taken down eight
        // steps (+0.2 to -0.2), safe entered at its boldest and taken down eight: 22 changes.
        assert_eq!(path.len(), 23, "{profiles:?}");
        assert_eq!(profiles[4], Profile::Aggressive);
        assert_eq!((profiles[5], path[5].level_thresholds), (Profile::Balanced, t(0.9, 0.7, 0.5)));
        assert_eq!(path[13].level_thresholds, t(0.5, 0.3, 0.1), "balanced's safest");
        assert_eq!((profiles[14], path[14].level_thresholds), (Profile::Safe, t(1.01, 0.7, 0.0)));
        let last = path.last().unwrap();
        assert_eq!((last.profile, last.level_thresholds), (Profile::Safe, t(0.81, 0.3, 0.0)), "safe never evicts");
        // Every step moved the thresholds down or none up: each stores at least as exactly.
        assert!(path[..5].windows(2).all(|w| w[1].level_thresholds.int4 < w[0].level_thresholds.int4));
    }

    #[test]
    fn headroom_under_pressure_walks_the_ladder_up_to_aggressive() {
        let path = walk(dynamic("safe"), 0.1, 0.5, 0.99, 100);
        let last = path.last().unwrap();
        assert_eq!((last.profile, last.level_thresholds), (Profile::Aggressive, t(1.01, 1.01, 0.5)));
        assert_eq!(path[5].profile, Profile::Balanced, "safe's four steps up, then balanced");
        assert_eq!(path[5].level_thresholds, t(0.5, 0.3, 0.1), "entered at its safest");
        assert_eq!(path.len(), 23);
    }

    #[test]
    fn a_step_back_undoes_a_step() {
        let p = dynamic("balanced");
        let mut refit = Refit::from(p.level_thresholds);
        let up = adjust(&p, &mut refit, 0.1, 0.5, 0.9).unwrap();
        assert_eq!(up, Adjustment::Thresholds(t(0.75, 0.55, 0.35)));
        let p2 = p.patched_json(&up.patch()).unwrap();
        let back = adjust(&p2, &mut refit, 0.8, 0.5, 0.9).unwrap();
        assert_eq!(back, Adjustment::Thresholds(p.level_thresholds));
        assert_eq!(refit, Refit::from(p.level_thresholds));
    }

    #[test]
    fn inside_the_budget_or_without_pressure_nothing_changes() {
        let p = dynamic("balanced");
        let mut refit = Refit::from(p.level_thresholds);
        // Between half the budget and the budget: stay.
        assert_eq!(adjust(&p, &mut refit, 0.3, 0.5, 0.95), None);
        // Headroom but no pressure: nothing to save.
        assert_eq!(adjust(&p, &mut refit, 0.0, 0.5, 0.2), None);
        assert_eq!(adjust(&p, &mut refit, f64::NAN, 0.5, 0.95), None);
        // A budget of 0 accepts no loss: any estimate above it steps safer, none steps bolder.
        assert!(matches!(adjust(&p, &mut refit, 0.01, 0.0, 0.95), Some(Adjustment::Thresholds(_))));
        let safe = dynamic("safe");
        assert_eq!(adjust(&safe, &mut Refit::from(safe.level_thresholds), 0.0, 0.0, 0.95), None);
    }

    #[test]
    fn thresholds_set_by_the_api_are_the_new_base() {
        let p = dynamic("balanced");
        let mut refit = Refit::from(p.level_thresholds);
        assert!(adjust(&p, &mut refit, 0.8, 0.5, 0.9).is_some());
        assert_eq!(refit.steps, -1);
        let set =
            p.patched_json(&json!({"level_thresholds": {"L1_int8": 0.6, "L2_int4": 0.4, "L3_evict": 0.2}})).unwrap();
        assert_eq!(adjust(&set, &mut refit, 0.8, 0.5, 0.9), Some(Adjustment::Thresholds(t(0.55, 0.35, 0.15))));
        assert_eq!(refit, Refit { base: t(0.6, 0.4, 0.2), steps: -1 });
    }

    fn t(int8: f64, int4: f64, evict: f64) -> Thresholds {
        Thresholds { int8, int4, evict }
    }
}
