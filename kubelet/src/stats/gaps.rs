//! What a stats refresh could not read ([`Gaps`]), and [`Watch`], which turns a series of
//! them into the changes worth one log line each: a source going blind, a source seen again.
//! A refresh with gaps still serves everything else it read. Pure.

use std::collections::BTreeMap;

/// A source of figures that can fail on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// The whole refresh (no snapshot at all).
    Refresh,
    /// ListPodSandbox: no pod is known, only the node's own figures are.
    PodSandboxes,
    /// ListContainers: pods without their containers.
    Containers,
    /// ListPodSandboxStats failed; each ready sandbox's PodSandboxStats stands in.
    SandboxStatsList,
    /// PodSandboxStats failed for some ready sandboxes (after the list failed).
    SandboxStats,
    /// ImageFsInfo: the image and container filesystems.
    ImageFs,
}

impl Source {
    /// What is missing, for a log line.
    pub fn what(self) -> &'static str {
        match self {
            Source::Refresh => "any stats (the refresh failed)",
            Source::PodSandboxes => "the pods (ListPodSandbox failed)",
            Source::Containers => "the containers (ListContainers failed)",
            Source::SandboxStatsList => {
                "the runtime's stats list (ListPodSandboxStats failed; each ready sandbox is asked instead)"
            }
            Source::SandboxStats => "some sandboxes' runtime stats (PodSandboxStats failed)",
            Source::ImageFs => "the image filesystem (ImageFsInfo failed)",
        }
    }

    /// What the eviction manager makes of it, for the same line.
    pub fn consequence(self) -> &'static str {
        match self {
            Source::Refresh => "no signal can be observed until a refresh succeeds",
            Source::PodSandboxes | Source::Containers => {
                "local storage limits are not checked and pods are ranked without their usage; node signals still act"
            }
            Source::SandboxStatsList => "every signal still acts",
            Source::SandboxStats => {
                "those pods' writable layers and process counts are unknown (their volumes and logs still count); every other signal still acts"
            }
            Source::ImageFs => "imagefs and containerfs signals are unknown; the others still act",
        }
    }
}

/// The sources one refresh could not read, each with why.
pub type Gaps = BTreeMap<Source, String>;

/// How one source changed since the last look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Unreadable now, readable before (or at the first look): why.
    Blind(Source, String),
    /// Readable again.
    Recovered(Source),
}

/// Remembers which sources were blind at the last look.
#[derive(Debug, Default)]
pub struct Watch {
    blind: Gaps,
}

impl Watch {
    /// The changes from the last look to `now` (a source that stays blind, even with another
    /// message, is no change).
    pub fn update(&mut self, now: &Gaps) -> Vec<Change> {
        let mut out: Vec<Change> = now
            .iter()
            .filter(|(s, _)| !self.blind.contains_key(s))
            .map(|(s, why)| Change::Blind(*s, why.clone()))
            .collect();
        out.extend(
            self.blind
                .keys()
                .filter(|s| !now.contains_key(s))
                .map(|s| Change::Recovered(*s)),
        );
        self.blind = now.clone();
        out
    }

    /// The sources blind at the last look.
    pub fn blind(&self) -> &Gaps {
        &self.blind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_reported_when_it_goes_blind_and_when_it_recovers_not_in_between() {
        let mut w = Watch::default();
        assert!(w.update(&Gaps::new()).is_empty());
        let down: Gaps = [(Source::ImageFs, "Unavailable: down".to_string())].into();
        assert_eq!(
            w.update(&down),
            [Change::Blind(Source::ImageFs, "Unavailable: down".into())]
        );
        // Still blind, whatever the message: nothing to say.
        assert!(w.update(&down).is_empty());
        let other: Gaps = [(Source::ImageFs, "DeadlineExceeded".to_string())].into();
        assert!(w.update(&other).is_empty());
        // Another source goes blind while the first recovers.
        let pods: Gaps = [(Source::PodSandboxes, "x".to_string())].into();
        assert_eq!(
            w.update(&pods),
            [
                Change::Blind(Source::PodSandboxes, "x".into()),
                Change::Recovered(Source::ImageFs)
            ]
        );
        assert_eq!(w.blind().len(), 1);
        assert_eq!(
            w.update(&Gaps::new()),
            [Change::Recovered(Source::PodSandboxes)]
        );
        assert!(w.update(&Gaps::new()).is_empty());
    }
}
