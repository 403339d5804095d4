//! GPU models as a matrix names them, matched against the product names
//! NVML reports; NVML's clocks-throttle reasons and their keys.

/// Whether a product name is of `model`: the model's words appear in the
/// name, in order, as whole words, so "H200" matches "NVIDIA H200" but not
/// "NVIDIA GH200 480GB", and "H20" does not match "NVIDIA H200".
pub fn model_matches(product_name: &str, model: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_ascii_lowercase).collect()
    };
    let (name, want) = (words(product_name), words(model));
    !want.is_empty() && name.windows(want.len()).any(|w| w == want.as_slice())
}

/// Whether a model as a matrix names it is of the H100 or H200 families
/// benchfleet is made for ("H100", "h200", "H100 NVL", "NVIDIA H200 NVL").
pub fn supported_family(model: &str) -> bool {
    model
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w.eq_ignore_ascii_case("h100") || w.eq_ignore_ascii_case("h200"))
}

/// NVML's clocks-throttle reason bits, the key a policy names each by, and
/// how a verdict says it.
pub const THROTTLE_REASONS: &[(u64, &str, &str)] = &[
    (0x1, "gpu_idle", "GPU idle"),
    (0x2, "applications_clocks_setting", "applications clocks setting"),
    (0x4, "sw_power_cap", "SW power cap"),
    (0x8, "hw_slowdown", "HW slowdown"),
    (0x10, "sync_boost", "sync boost"),
    (0x20, "sw_thermal_slowdown", "SW thermal slowdown"),
    (0x40, "hw_thermal_slowdown", "HW thermal slowdown"),
    (0x80, "hw_power_brake_slowdown", "HW power brake slowdown"),
    (0x100, "display_clock_setting", "display clock setting"),
];

/// The keys of the throttle reasons set in NVML's bit mask; bits NVML may
/// add later are named by their value, so they are never silently dropped.
pub fn throttle_reason_keys(bits: u64) -> Vec<String> {
    let mut keys: Vec<String> =
        THROTTLE_REASONS.iter().filter(|(bit, _, _)| bits & bit != 0).map(|(_, key, _)| (*key).to_owned()).collect();
    let known = THROTTLE_REASONS.iter().fold(0, |all, (bit, _, _)| all | bit);
    let unknown = bits & !known;
    if unknown != 0 {
        keys.push(format!("unknown_{unknown:#x}"));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_bits_name_every_reason_and_keep_unknown_ones() {
        let check = |bits: u64, expected: &[&str]| assert_eq!(throttle_reason_keys(bits), expected, "bits {bits:#x}");
        check(0, &[]);
        check(0x1, &["gpu_idle"]);
        check(0x8 | 0x40, &["hw_slowdown", "hw_thermal_slowdown"]);
        check(0x100, &["display_clock_setting"]);
        check(0x1 | 0x1000, &["gpu_idle", "unknown_0x1000"]);
    }

    #[test]
    fn the_supported_families_are_h100_and_h200() {
        for (model, expected) in [
            ("H100", true),
            ("h200", true),
            ("H100 NVL", true),
            ("NVIDIA H200 141GB HBM3e", true),
            ("A100", false),
            ("GH200", false),
            ("H20", false),
            ("H1000", false),
            ("", false),
        ] {
            assert_eq!(supported_family(model), expected, "{model}");
        }
    }

    #[test]
    fn model_names_match_whole_words() {
        for (name, model, expected) in [
            ("NVIDIA H200", "H200", true),
            ("NVIDIA H200", "h200", true),
            ("NVIDIA H100 80GB HBM3", "H100", true),
            ("NVIDIA H100 NVL", "H100 NVL", true),
            ("NVIDIA H100 PCIe", "H100 NVL", false),
            ("NVIDIA H200", "H20", false),
            ("NVIDIA GH200 480GB", "H200", false),
            ("NVIDIA A100-SXM4-80GB", "A100", true),
            ("NVIDIA H200", "", false),
        ] {
            assert_eq!(model_matches(name, model), expected, "{name} is {model}?");
        }
    }
}
