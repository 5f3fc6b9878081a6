//! The systemd cgroup driver: the kubelet's cgroups are transient slices
//! (`kubepods.slice`, `kubepods-burstable.slice`, `kubepods-burstable-pod<uid>.slice`) made
//! and limited through systemd's D-Bus API (`org.freedesktop.systemd1.Manager`:
//! StartTransientUnit, SetUnitProperties, StopUnit), as upstream's libcontainer systemd
//! manager does. Limits become unit properties; reading them back reads the slices' cgroup
//! files. Where systemd is not PID 1 every call fails with one clear error.

use super::cgroups::{CgroupError, CgroupLimits, CgroupVersion, Cgroups, shares_to_weight};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A unit property's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropValue {
    U64(u64),
    Bool(bool),
    Str(String),
}

/// `(name, value)` as systemd's `a(sv)`.
pub type Props = Vec<(&'static str, PropValue)>;

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error(
        "cgroupDriver is systemd but systemd is not running as PID 1 here (no /run/systemd/system): \
         set cgroupDriver: cgroupfs, or run the kubelet under systemd"
    )]
    NotRunning,
    #[error("systemd {op} {unit}: {message}")]
    Call {
        op: &'static str,
        unit: String,
        message: String,
    },
}

/// What the driver asks of systemd. Blocking calls: run them on the blocking pool.
pub trait SystemdUnits: Send + Sync + 'static {
    fn start_slice(&self, name: &str, props: &Props) -> Result<(), SystemdError>;
    fn set_properties(&self, name: &str, props: &Props) -> Result<(), SystemdError>;
    /// Stops (removes) the unit; an unknown unit is fine.
    fn stop_unit(&self, name: &str) -> Result<(), SystemdError>;
}

/// The cgroupfs path of a slice: `a-b-c.slice` → `/a.slice/a-b.slice/a-b-c.slice`; a name
/// given as a path (`/system.slice`, a reserved cgroup) is already one.
pub fn slice_path(name: &str) -> String {
    if name.starts_with('/') {
        return name.to_string();
    }
    let Some(stem) = name.strip_suffix(".slice") else {
        return name.to_string();
    };
    let parts: Vec<&str> = stem.split('-').collect();
    let mut out = String::new();
    for i in 1..=parts.len() {
        out.push('/');
        out.push_str(&parts[..i].join("-"));
        out.push_str(".slice");
    }
    out
}

/// libcontainer's CPUQuotaPerSecUSec: quota × 1s / period, rounded up to whole 10ms (systemd
/// keeps that precision); no quota → infinity.
pub fn quota_per_sec_usec(quota: i64, period: u64) -> u64 {
    if quota <= 0 || period == 0 {
        return u64::MAX;
    }
    let v = (quota as u64).saturating_mul(1_000_000) / period;
    v.div_ceil(10_000) * 10_000
}

/// The unit properties that carry `l` on cgroup layout `v`. Hugetlb has no systemd property
/// (libcontainer writes its files afterwards); it is left out here.
pub fn unit_props(l: &CgroupLimits, v: CgroupVersion) -> Props {
    let mut p = Props::new();
    let max = |n: i64| if n < 0 { u64::MAX } else { n as u64 };
    if let Some(s) = l.cpu_shares {
        match v {
            CgroupVersion::V1 => p.push(("CPUShares", PropValue::U64(s))),
            CgroupVersion::V2 => p.push(("CPUWeight", PropValue::U64(shares_to_weight(s)))),
        }
    }
    if let Some(q) = l.cpu_quota {
        let period = l.cpu_period.unwrap_or(100_000);
        if l.cpu_period.is_some() {
            p.push(("CPUQuotaPeriodUSec", PropValue::U64(period)));
        }
        p.push((
            "CPUQuotaPerSecUSec",
            PropValue::U64(quota_per_sec_usec(q, period)),
        ));
    }
    if let Some(m) = l.memory.filter(|m| *m != 0) {
        let name = match v {
            CgroupVersion::V1 => "MemoryLimit",
            CgroupVersion::V2 => "MemoryMax",
        };
        p.push((name, PropValue::U64(max(m))));
    }
    if let Some(t) = l.pids {
        p.push(("TasksMax", PropValue::U64(max(t))));
    }
    p
}

/// [`Cgroups`] over systemd slices; names are slice names (`kubepods-pod<uid>.slice`).
pub struct SystemdCgroups {
    units: Arc<dyn SystemdUnits>,
    /// Reads the slices' files.
    fs: Arc<dyn Cgroups>,
}

impl SystemdCgroups {
    pub fn new(units: Arc<dyn SystemdUnits>, fs: Arc<dyn Cgroups>) -> Self {
        Self { units, fs }
    }
}

/// The unit a name stands for: a reserved cgroup given as a path (`/system.slice`) is its
/// last component.
pub fn unit_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn cg_err(name: &str, e: SystemdError) -> CgroupError {
    CgroupError {
        path: name.to_string(),
        source: std::io::Error::other(e.to_string()),
    }
}

impl Cgroups for SystemdCgroups {
    fn create(&self, name: &str) -> Result<(), CgroupError> {
        let props: Props = vec![
            ("Description", PropValue::Str(format!("kubelet: {name}"))),
            ("CPUAccounting", PropValue::Bool(true)),
            ("MemoryAccounting", PropValue::Bool(true)),
            ("TasksAccounting", PropValue::Bool(true)),
        ];
        self.units
            .start_slice(unit_name(name), &props)
            .map_err(|e| cg_err(name, e))
    }

    fn remove(&self, name: &str) -> Result<(), CgroupError> {
        self.units
            .stop_unit(unit_name(name))
            .map_err(|e| cg_err(name, e))
    }

    fn set(&self, name: &str, limits: &CgroupLimits) -> Result<(), CgroupError> {
        let props = unit_props(limits, self.fs.version());
        if !limits.hugetlb.is_empty() {
            tracing::debug!(unit = name, "hugetlb limits are not set through systemd");
        }
        if props.is_empty() {
            return Ok(());
        }
        self.units
            .set_properties(unit_name(name), &props)
            .map_err(|e| cg_err(name, e))
    }

    fn read(&self, name: &str) -> Result<BTreeMap<String, String>, CgroupError> {
        self.fs.read(&slice_path(name))
    }

    fn version(&self) -> CgroupVersion {
        self.fs.version()
    }

    fn exists(&self, name: &str) -> bool {
        self.fs.exists(&slice_path(name))
    }
}

/// No systemd here: every call is [`SystemdError::NotRunning`].
pub struct NoSystemd;

impl SystemdUnits for NoSystemd {
    fn start_slice(&self, _: &str, _: &Props) -> Result<(), SystemdError> {
        Err(SystemdError::NotRunning)
    }
    fn set_properties(&self, _: &str, _: &Props) -> Result<(), SystemdError> {
        Err(SystemdError::NotRunning)
    }
    fn stop_unit(&self, _: &str) -> Result<(), SystemdError> {
        Err(SystemdError::NotRunning)
    }
}

const SYSTEMD: &str = "org.freedesktop.systemd1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// Every bus call is bounded.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// systemd over the system bus. Calls block their (blocking-pool) thread on the runtime.
pub struct DbusUnits {
    conn: zbus::Connection,
    rt: tokio::runtime::Handle,
}

impl DbusUnits {
    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` or the default socket).
    pub async fn connect() -> Result<DbusUnits, SystemdError> {
        let fail = |message: String| SystemdError::Call {
            op: "connect",
            unit: String::new(),
            message,
        };
        let conn = tokio::time::timeout(CALL_TIMEOUT, zbus::Connection::system())
            .await
            .map_err(|_| fail("no answer within 10s".into()))?
            .map_err(|e| fail(e.to_string()))?;
        Ok(DbusUnits {
            conn,
            rt: tokio::runtime::Handle::current(),
        })
    }

    fn call<B>(&self, op: &'static str, unit: &str, body: &B) -> Result<(), SystemdError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        let fut = self
            .conn
            .call_method(Some(SYSTEMD), SYSTEMD_PATH, Some(MANAGER), op, body);
        let err = |message: String| SystemdError::Call {
            op,
            unit: unit.to_string(),
            message,
        };
        match self.rt.block_on(tokio::time::timeout(CALL_TIMEOUT, fut)) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(err(e.to_string())),
            Err(_) => Err(err("no answer within 10s".into())),
        }
    }
}

fn values(props: &Props) -> Vec<(&'static str, zbus::zvariant::Value<'static>)> {
    use zbus::zvariant::Value;
    props
        .iter()
        .map(|(k, v)| {
            let v = match v {
                PropValue::U64(n) => Value::U64(*n),
                PropValue::Bool(b) => Value::Bool(*b),
                PropValue::Str(s) => Value::from(s.clone()),
            };
            (*k, v)
        })
        .collect()
}

impl SystemdUnits for DbusUnits {
    fn start_slice(&self, name: &str, props: &Props) -> Result<(), SystemdError> {
        let aux: Vec<(&str, Vec<(&str, zbus::zvariant::Value<'static>)>)> = Vec::new();
        match self.call(
            "StartTransientUnit",
            name,
            &(name, "replace", values(props), aux),
        ) {
            // Already there (a restarted kubelet): fine, as upstream.
            Err(SystemdError::Call { message, .. }) if message.contains("UnitExists") => Ok(()),
            other => other,
        }
    }

    fn set_properties(&self, name: &str, props: &Props) -> Result<(), SystemdError> {
        self.call("SetUnitProperties", name, &(name, true, values(props)))
    }

    fn stop_unit(&self, name: &str) -> Result<(), SystemdError> {
        match self.call("StopUnit", name, &(name, "replace")) {
            Err(SystemdError::Call { message, .. }) if message.contains("NoSuchUnit") => Ok(()),
            other => other,
        }
    }
}

/// Records every call; the slices it started are "live".
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct FakeUnits {
    pub calls: std::sync::Mutex<Vec<(String, String, Props)>>,
}

#[cfg(any(test, feature = "test-util"))]
impl SystemdUnits for FakeUnits {
    fn start_slice(&self, name: &str, props: &Props) -> Result<(), SystemdError> {
        let mut c = self.calls.lock().unwrap();
        c.push(("StartTransientUnit".into(), name.into(), props.clone()));
        Ok(())
    }
    fn set_properties(&self, name: &str, props: &Props) -> Result<(), SystemdError> {
        let mut c = self.calls.lock().unwrap();
        c.push(("SetUnitProperties".into(), name.into(), props.clone()));
        Ok(())
    }
    fn stop_unit(&self, name: &str) -> Result<(), SystemdError> {
        let mut c = self.calls.lock().unwrap();
        c.push(("StopUnit".into(), name.into(), Props::new()));
        Ok(())
    }
}
