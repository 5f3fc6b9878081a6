//! Test only: README.md's feature list must not call refused a mode that docs/settings.md
//! marks Implemented (issue 30: README said IPVS "is refused" after the backend landed).

/// The modes the documents name, and the settings rows that say whether each works.
const MODES: &[(&str, &[&str])] = &[
    ("iptables", &["mode", "--proxy-mode"]),
    ("nftables", &["mode", "--proxy-mode"]),
    ("ipvs", &["mode", "--proxy-mode"]),
    ("ClusterCIDR", &["detectLocalMode", "--detect-local-mode"]),
    ("NodeCIDR", &["detectLocalMode", "--detect-local-mode"]),
    (
        "BridgeInterface",
        &["detectLocalMode", "--detect-local-mode"],
    ),
    (
        "InterfaceNamePrefix",
        &["detectLocalMode", "--detect-local-mode"],
    ),
];

/// Words that call a mode unavailable.
const REFUSALS: &[&str] = &[
    "refused",
    "refuses",
    "not supported",
    "not implemented",
    "unsupported",
];

/// The modes docs/settings.md marks Implemented: named in the note of an Implemented row
/// that governs them.
pub fn implemented_modes(settings_md: &str) -> Vec<&'static str> {
    MODES
        .iter()
        .filter(|(mode, rows)| {
            settings_md.lines().any(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                cells.len() >= 4
                    && rows.iter().any(|r| cells[1] == format!("`{r}`"))
                    && cells[2] == "Implemented"
                    && contains_word(cells[3], mode)
            })
        })
        .map(|(m, _)| *m)
        .collect()
}

fn contains_word(text: &str, word: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w.eq_ignore_ascii_case(word))
}

/// README sentences that call an implemented mode refused: (mode, sentence).
pub fn disagreements(readme: &str, settings_md: &str) -> Vec<(&'static str, String)> {
    let text = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let sentences: Vec<&str> = text.split_inclusive(". ").collect();
    let mut out = Vec::new();
    for mode in implemented_modes(settings_md) {
        for s in &sentences {
            let lower = s.to_ascii_lowercase();
            if contains_word(s, mode) && REFUSALS.iter().any(|r| lower.contains(r)) {
                out.push((mode, s.trim().to_string()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: &str = "| `mode` | Implemented | iptables (default), nftables, and ipvs (deprecated upstream). |\n\
        | `detectLocalMode` | Implemented | Only ClusterCIDR; the other modes are refused with an error. |\n";

    #[test]
    fn implemented_modes_come_from_implemented_rows() {
        assert_eq!(
            implemented_modes(SETTINGS),
            ["iptables", "nftables", "ipvs", "ClusterCIDR"]
        );
        let not = "| `mode` | NotImplemented | ipvs. |\n";
        assert!(implemented_modes(not).is_empty());
    }

    #[test]
    fn a_readme_that_refuses_an_implemented_mode_is_caught() {
        // README.md's wording before issue 30.
        let old = "leftovers. IPVS mode is refused with a clear error.\n- **A pod network";
        let found = disagreements(old, SETTINGS);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "ipvs");
        // A mode the settings do not mark Implemented may be called refused.
        let ok = "The NodeCIDR and BridgeInterface modes are refused. IPVS mode works where the kernel has ip_vs.";
        assert!(disagreements(ok, SETTINGS).is_empty());
    }

    /// The real documents.
    #[test]
    fn readme_and_settings_doc_agree_on_modes() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let settings = std::fs::read_to_string(root.join("docs/settings.md")).unwrap();
        assert!(!implemented_modes(&settings).is_empty());
        let found = disagreements(&readme, &settings);
        assert!(
            found.is_empty(),
            "README.md calls refused what docs/settings.md marks Implemented: {found:?}"
        );
    }
}
