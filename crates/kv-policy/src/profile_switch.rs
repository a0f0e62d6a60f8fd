//! The slow loop's decision (spec 002, 4.1: "quantization profile switching"): which profile a
//! model under the dynamic policy should run, from its estimated quality cost (`delta_ppl_est`,
//! from its calibration table), the quality budget of the run context, and memory pressure.
//!
//! Over budget, one step safer (aggressive, balanced, safe). Well inside it (under half) while
//! the cache is past the profile's first pressure band, one step bolder, to save memory while
//! quality allows. A safer profile stops further loss. In an engine that keeps f16 copies (the
//! native engine's spill tier), it also promotes the blocks the safer profile puts higher.
//! Without copies, it cannot undo what was already quantized or evicted, and the estimate falls
//! only as those blocks leave.

use crate::{Pressure, Profile};

/// The share of the quality budget under which a bolder profile may be tried.
pub const HEADROOM: f64 = 0.5;

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

/// The profile to switch to, if any: `estimate` and `budget` are relative delta-PPL in
/// percent, `pressure` the share of the KV budget in use, `bands` the running profile's.
pub fn next_profile(current: Profile, estimate: f64, budget: f64, pressure: f64, bands: Pressure) -> Option<Profile> {
    if !(estimate.is_finite() && budget.is_finite()) {
        return None;
    }
    if estimate > budget {
        current.safer()
    } else if estimate < budget * HEADROOM && pressure > bands.mid {
        current.bolder()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BANDS: Pressure = Pressure { mid: 0.6, high: 0.8 };

    #[test]
    fn over_budget_steps_safer_and_stops_at_safe() {
        assert_eq!(next_profile(Profile::Aggressive, 0.8, 0.5, 0.9, BANDS), Some(Profile::Balanced));
        assert_eq!(next_profile(Profile::Balanced, 0.8, 0.5, 0.9, BANDS), Some(Profile::Safe));
        assert_eq!(next_profile(Profile::Safe, 0.8, 0.5, 0.9, BANDS), None);
    }

    #[test]
    fn headroom_under_pressure_steps_bolder_and_stops_at_aggressive() {
        assert_eq!(next_profile(Profile::Safe, 0.1, 0.5, 0.7, BANDS), Some(Profile::Balanced));
        assert_eq!(next_profile(Profile::Balanced, 0.1, 0.5, 0.7, BANDS), Some(Profile::Aggressive));
        assert_eq!(next_profile(Profile::Aggressive, 0.1, 0.5, 0.99, BANDS), None);
    }

    #[test]
    fn inside_the_budget_or_without_pressure_nothing_changes() {
        // Between half the budget and the budget: stay.
        assert_eq!(next_profile(Profile::Balanced, 0.3, 0.5, 0.95, BANDS), None);
        // Headroom but no pressure: nothing to save.
        assert_eq!(next_profile(Profile::Balanced, 0.0, 0.5, 0.2, BANDS), None);
        // A budget of 0 accepts no loss: any estimate above it steps safer, none steps bolder.
        assert_eq!(next_profile(Profile::Balanced, 0.01, 0.0, 0.95, BANDS), Some(Profile::Safe));
        assert_eq!(next_profile(Profile::Safe, 0.0, 0.0, 0.95, BANDS), None);
        assert_eq!(next_profile(Profile::Balanced, f64::NAN, 0.5, 0.95, BANDS), None);
    }
}
