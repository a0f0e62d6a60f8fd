//! `general.file_type` (llama.cpp's `llama_ftype`) to the quantization names used in model
//! names and file names (`Q4_K_M`). Numbers from llama.h; gaps are types removed from llama.cpp.

/// llama.cpp sets this bit when it guessed the type of a file that did not record one.
const GUESSED: u32 = 1024;

pub fn quantization_name(file_type: u32) -> Option<&'static str> {
    Some(match file_type & !GUESSED {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        39 => "NVFP4",
        40 => "Q1_0",
        41 => "Q2_0",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_h() {
        assert_eq!(quantization_name(3), Some("Q4_1"));
        assert_eq!(quantization_name(15), Some("Q4_K_M"));
        assert_eq!(quantization_name(18), Some("Q6_K"));
        assert_eq!(quantization_name(32), Some("BF16"));
        assert_eq!(quantization_name(15 | GUESSED), Some("Q4_K_M"));
    }

    #[test]
    fn removed_and_unknown_types_have_no_name() {
        for removed in [4, 5, 6, 33, 34, 35, 9999] {
            assert_eq!(quantization_name(removed), None, "{removed}");
        }
    }
}
