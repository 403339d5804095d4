//! GPU models as a matrix names them, matched against the product names
//! NVML reports.

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

#[cfg(test)]
mod tests {
    use super::*;

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
