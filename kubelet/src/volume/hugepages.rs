//! emptyDir `medium: HugePages` and `HugePages-<size>`: a hugetlbfs mount whose page size
//! comes from the pod's huge page requests, as upstream's emptyDir plugin decides it
//! (`getPageSizeMountOption`).

use k8s_openapi::api::core::v1::Pod;
use plumbing::quantity;

/// The medium names a hugetlbfs emptyDir.
pub fn is_huge_page_medium(medium: &str) -> bool {
    medium == "HugePages" || medium.starts_with("HugePages-")
}

/// Why a hugetlbfs emptyDir gets no page size (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HugePagesError {
    #[error("{size}: {message}")]
    BadSize { size: String, message: String },
    #[error("medium: {0} can't be used if container requests multiple huge page sizes")]
    MultipleSizes(String),
    #[error(
        "medium {0}: hugePages storage requested, but there is no resource request for huge pages"
    )]
    NoRequest(String),
}

fn bad_size(size: &str, e: impl std::fmt::Display) -> HugePagesError {
    HugePagesError::BadSize {
        size: size.to_string(),
        message: e.to_string(),
    }
}

fn bytes(size: &str) -> Result<i128, HugePagesError> {
    quantity::parse_value(size).map_err(|e| bad_size(size, e))
}

/// The `pagesize=<size>` mount option for `medium`: `HugePages` takes the one page size the
/// containers request (several sizes are an error), `HugePages-<size>` needs a request of that
/// size. Sizes print as upstream's Quantity does (`2Mi`).
pub fn page_size_option(medium: &str, pod: &Pod) -> Result<String, HugePagesError> {
    let wanted = match medium.strip_prefix("HugePages-") {
        Some(size) => Some(bytes(size)?),
        None => None,
    };
    let mut found: Option<(i128, String)> = None;
    let spec = pod.spec.as_ref();
    // Init containers can consume huge pages too.
    let containers = spec.into_iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    for c in containers {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        for name in requests.into_iter().flat_map(|r| r.keys()) {
            let Some(size) = name.strip_prefix("hugepages-") else {
                continue;
            };
            let current = bytes(size)?;
            match wanted {
                None => {
                    if found.as_ref().is_some_and(|(b, _)| *b != current) {
                        return Err(HugePagesError::MultipleSizes(medium.to_string()));
                    }
                    found = Some((current, size.to_string()));
                }
                Some(w) if w == current => found = Some((current, size.to_string())),
                Some(_) => {}
            }
        }
    }
    let (_, size) = found.ok_or_else(|| HugePagesError::NoRequest(medium.to_string()))?;
    let canonical = quantity::canonical(&size).map_err(|e| bad_size(&size, e))?;
    Ok(format!("pagesize={canonical}"))
}

#[cfg(test)]
mod tests;
