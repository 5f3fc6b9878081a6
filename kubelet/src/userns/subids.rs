//! The node's ID range for pods: the `kubelet` user's subordinate IDs in `/etc/subuid` and
//! `/etc/subgid` (one entry each, identical, as upstream reads them through `getsubids`), or
//! upstream's default when neither names it.

use super::UsernsError;

pub const SUBUID_FILE: &str = "/etc/subuid";
pub const SUBGID_FILE: &str = "/etc/subgid";
/// Upstream's default range: every ID from 65536 up.
pub const DEFAULT_FIRST_ID: u32 = 1 << 16;
pub const DEFAULT_LENGTH: u32 = (u32::MAX - DEFAULT_FIRST_ID) + 1;
const USER: &str = "kubelet";

/// The `(first ID, length)` of the node's range from the two files' text (None: the file is
/// absent). Pure.
pub fn kubelet_range(
    subuid: Option<&str>,
    subgid: Option<&str>,
) -> Result<(u32, u32), UsernsError> {
    let uids = entries(subuid.unwrap_or_default());
    let gids = entries(subgid.unwrap_or_default());
    if uids.is_empty() && gids.is_empty() {
        return Ok((DEFAULT_FIRST_ID, DEFAULT_LENGTH));
    }
    if uids != gids {
        return Err(UsernsError::Mismatched);
    }
    if uids.len() != 1 {
        return Err(UsernsError::SubIds(format!(
            "error parsing line {:?}: it must contain only one line",
            uids.join("\n")
        )));
    }
    let line = &uids[0];
    let mut parts = line.split(':').skip(1);
    let mut num = || -> Result<u32, UsernsError> {
        let p = parts.next().unwrap_or_default().trim();
        p.parse::<u32>()
            .map_err(|e| UsernsError::SubIds(format!("error parsing line {line:?}: {e}")))
    };
    let (first, len) = (num()?, num()?);
    if line.split(':').count() != 3 {
        return Err(UsernsError::SubIds(format!("invalid line {line:?}")));
    }
    Ok((first, len))
}

/// The `kubelet` user's lines (`name:first:count`), comments and blank lines skipped.
fn entries(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| l.split(':').next() == Some(USER))
        .map(String::from)
        .collect()
}
