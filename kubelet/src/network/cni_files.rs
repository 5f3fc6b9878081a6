//! The files the controller owns on the node: the conflist in the runtime's CNI config dir
//! and the plugin binary in the CNI bin dir. Everything here is blocking file work: the
//! controller calls it on the blocking pool.

use std::io;
use std::path::{Path, PathBuf};

use plumbing::cidr::Cidr;
use serde_json::json;

use super::settings::{PLUGIN_NAME, Settings};

/// The conflist's file name: sorts early, so libcni (which loads the first file by name)
/// picks it over a later default.
pub const CONFLIST_NAME: &str = "10-node-agent.conflist";
/// The network's name (also the allocation directory under `dataDir`).
pub const NETWORK_NAME: &str = "node-agent";

/// What the conflist holds, rendered by [`render_conflist`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfInput {
    /// The node's pod CIDRs (`spec.podCIDRs`), one per family.
    pub subnets: Vec<Cidr>,
    pub mtu: u32,
    pub data_dir: PathBuf,
    /// Chain the `portmap` plugin (hostPort): only when it is in the bin dir.
    pub portmap: bool,
}

/// The conflist text (cniVersion 1.0.0): `node-agent-cni` with `ipam.subnet` (one family) or
/// `ipam.subnets` (dual-stack), then `portmap` when present.
pub fn render_conflist(input: &ConfInput) -> String {
    let ipam = match input.subnets.as_slice() {
        [one] => json!({ "subnet": one.to_string() }),
        many => json!({ "subnets": many.iter().map(ToString::to_string).collect::<Vec<_>>() }),
    };
    let mut plugins = vec![json!({
        "type": PLUGIN_NAME,
        "bridge": cni::config::DEFAULT_BRIDGE,
        "mtu": input.mtu,
        "ipam": ipam,
        "dataDir": input.data_dir,
    })];
    if input.portmap {
        plugins.push(json!({
            "type": "portmap",
            "capabilities": { "portMappings": true },
            "snat": true,
        }));
    }
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": plugins,
    });
    let mut text = serde_json::to_string_pretty(&conf).unwrap_or_default();
    text.push('\n');
    text
}

/// Configuration files libcni would load from `dir` (`.conf`, `.conflist`, `.json`) other
/// than ours, sorted. A missing directory has none.
pub fn other_configs(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_conf = Path::new(&name)
            .extension()
            .is_some_and(|e| e == "conf" || e == "conflist" || e == "json");
        if is_conf && name != CONFLIST_NAME && !entry.path().is_dir() {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Writes the conflist atomically unless the file already holds `text`. `Ok(true)`: written.
pub fn write_conflist(dir: &Path, text: &str) -> io::Result<bool> {
    let path = dir.join(CONFLIST_NAME);
    if std::fs::read_to_string(&path).is_ok_and(|cur| cur == text) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    crate::atomic_file::write_mode_atomic(&path, 0o644, text.as_bytes())?;
    crate::atomic_file::sync_dir(dir)?;
    Ok(true)
}

/// The plugin binary to install: the setting, or `node-agent-cni` beside `exe` (the running
/// kubelet).
pub fn plugin_source(settings: &Settings, exe: Option<&Path>) -> Option<PathBuf> {
    settings
        .plugin_path
        .clone()
        .or_else(|| exe.and_then(Path::parent).map(|dir| dir.join(PLUGIN_NAME)))
}

/// Copies `source` to `<bin_dir>/node-agent-cni` (mode 0755, atomically) unless the
/// installed file already has the same content. `Ok(true)`: installed.
pub fn install_plugin(source: &Path, bin_dir: &Path) -> io::Result<bool> {
    let want = std::fs::read(source).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("reading the plugin {}: {e}", source.display()),
        )
    })?;
    let dest = bin_dir.join(PLUGIN_NAME);
    if std::fs::read(&dest).is_ok_and(|cur| cur == want) {
        return Ok(false);
    }
    std::fs::create_dir_all(bin_dir)?;
    crate::atomic_file::write_mode_atomic(&dest, 0o755, &want)?;
    crate::atomic_file::sync_dir(bin_dir)?;
    Ok(true)
}

/// Whether the runtime can chain `portmap` (an executable file in the bin dir).
pub fn has_portmap(bin_dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(bin_dir.join("portmap"))
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
