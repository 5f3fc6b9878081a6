//! The systemd-logind edge of graceful node shutdown: a narrow trait, its D-Bus implementation
//! over the system bus (`DBUS_SYSTEM_BUS_ADDRESS` or the default socket), and a fake.
//!
//! On the bus, as upstream: the `InhibitDelayMaxUSec` property and the `Inhibit("shutdown",
//! "kubelet", "Kubelet needs time to handle node shutdown", "delay")` method of
//! `org.freedesktop.login1.Manager` at `/org/freedesktop/login1`, its `PrepareForShutdown(b)`
//! signal, and systemd's `KillUnit("systemd-logind.service", "all", SIGHUP)` to make logind
//! re-read `/etc/systemd/logind.conf.d/99-kubelet.conf`.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::mpsc;

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
/// Where upstream writes its InhibitDelayMaxSec override.
pub const LOGIND_CONF_DIR: &str = "/etc/systemd/logind.conf.d";
pub const KUBELET_LOGIND_CONF: &str = "99-kubelet.conf";
/// Every bus call is bounded.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    #[error("connecting to the system D-Bus: {0}")]
    Connect(String),
    #[error("logind {op}: {message}")]
    Call { op: &'static str, message: String },
    #[error("logind {0}: no answer within 10s")]
    Timeout(&'static str),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// What the shutdown manager asks of logind.
#[async_trait::async_trait]
pub trait Logind: Send + Sync {
    /// logind's InhibitDelayMaxUSec.
    async fn current_inhibit_delay(&self) -> Result<Duration, LogindError>;
    /// Writes the logind drop-in raising InhibitDelayMaxSec to `delay`.
    async fn override_inhibit_delay(&self, delay: Duration) -> Result<(), LogindError>;
    /// Makes logind re-read its configuration.
    async fn reload_logind_conf(&self) -> Result<(), LogindError>;
    /// Takes the delay inhibitor (replacing one already held).
    async fn inhibit(&self) -> Result<(), LogindError>;
    /// Releases the inhibitor (the shutdown proceeds).
    async fn release(&self) -> Result<(), LogindError>;
    /// PrepareForShutdown's argument, for each signal.
    async fn monitor_shutdown(&self) -> Result<mpsc::Receiver<bool>, LogindError>;
}

/// logind over the system bus.
pub struct DbusLogind {
    conn: zbus::Connection,
    conf_dir: PathBuf,
    /// The inhibitor's file descriptor: closing it releases the inhibitor.
    lock: Mutex<Option<zbus::zvariant::OwnedFd>>,
}

async fn timed<T>(
    op: &'static str,
    f: impl std::future::Future<Output = zbus::Result<T>>,
) -> Result<T, LogindError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(LogindError::Call {
            op,
            message: e.to_string(),
        }),
        Err(_) => Err(LogindError::Timeout(op)),
    }
}

impl DbusLogind {
    /// Connects to the system bus; `conf_dir` is where the InhibitDelayMaxSec override goes.
    pub async fn connect(conf_dir: PathBuf) -> Result<DbusLogind, LogindError> {
        let conn = match tokio::time::timeout(CALL_TIMEOUT, zbus::Connection::system()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(LogindError::Connect(e.to_string())),
            Err(_) => return Err(LogindError::Connect("no answer within 10s".into())),
        };
        Ok(DbusLogind {
            conn,
            conf_dir,
            lock: Mutex::new(None),
        })
    }

    async fn proxy(
        &self,
        dest: &'static str,
        path: &'static str,
        iface: &'static str,
    ) -> Result<zbus::Proxy<'static>, LogindError> {
        let build = async {
            zbus::proxy::Builder::new(&self.conn)
                .destination(dest)?
                .path(path)?
                .interface(iface)?
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await
        };
        timed("proxy", build).await
    }

    async fn manager(&self) -> Result<zbus::Proxy<'static>, LogindError> {
        self.proxy(LOGIND, LOGIND_PATH, LOGIND_MANAGER).await
    }
}

#[async_trait::async_trait]
impl Logind for DbusLogind {
    async fn current_inhibit_delay(&self) -> Result<Duration, LogindError> {
        let m = self.manager().await?;
        let usec: u64 = timed("InhibitDelayMaxUSec", m.get_property("InhibitDelayMaxUSec")).await?;
        Ok(Duration::from_micros(usec))
    }

    async fn override_inhibit_delay(&self, delay: Duration) -> Result<(), LogindError> {
        let dir = self.conf_dir.clone();
        let text = format!(
            "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={}\n",
            delay.as_secs()
        );
        let path = dir.join(KUBELET_LOGIND_CONF);
        let p = path.clone();
        let r = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)?;
            crate::atomic_file::write_public_atomic(&p, text.as_bytes())
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        r.map_err(|source| LogindError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    async fn reload_logind_conf(&self) -> Result<(), LogindError> {
        let systemd = self
            .proxy(
                "org.freedesktop.systemd1",
                "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager",
            )
            .await?;
        timed(
            "KillUnit(systemd-logind.service, SIGHUP)",
            systemd.call::<_, _, ()>("KillUnit", &("systemd-logind.service", "all", 1i32)),
        )
        .await
    }

    async fn inhibit(&self) -> Result<(), LogindError> {
        let m = self.manager().await?;
        let fd: zbus::zvariant::OwnedFd = timed(
            "Inhibit",
            m.call(
                "Inhibit",
                &(
                    "shutdown",
                    "kubelet",
                    "Kubelet needs time to handle node shutdown",
                    "delay",
                ),
            ),
        )
        .await?;
        // Replacing an old descriptor closes it, as upstream releases the old lock.
        *self.lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(fd);
        Ok(())
    }

    async fn release(&self) -> Result<(), LogindError> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }

    async fn monitor_shutdown(&self) -> Result<mpsc::Receiver<bool>, LogindError> {
        use futures::StreamExt;
        let m = self.manager().await?;
        let mut signals = timed(
            "subscribe PrepareForShutdown",
            m.receive_signal("PrepareForShutdown"),
        )
        .await?;
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // The proxy lives as long as the subscription.
            let _m = m;
            while let Some(msg) = signals.next().await {
                match msg.body().deserialize::<bool>() {
                    Ok(v) => {
                        if tx.send(v).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "PrepareForShutdown without a boolean; ignored")
                    }
                }
            }
        });
        Ok(rx)
    }
}

/// A scripted logind for tests: a settable delay, the inhibitor as a flag, signals sent by hand.
#[cfg(any(test, feature = "test-util"))]
pub mod fake {
    use super::*;

    #[derive(Default)]
    pub struct FakeLogind {
        pub delay: Mutex<Duration>,
        /// What a reload sets the delay to (None: the reload changes nothing).
        pub delay_after_reload: Mutex<Option<Duration>>,
        pub overrides: Mutex<Vec<Duration>>,
        pub inhibited: Mutex<bool>,
        pub inhibits: Mutex<u32>,
        tx: Mutex<Option<mpsc::Sender<bool>>>,
    }

    impl FakeLogind {
        pub async fn prepare_for_shutdown(&self, v: bool) {
            let tx = self.tx.lock().unwrap().clone();
            tx.expect("monitor_shutdown was called")
                .send(v)
                .await
                .unwrap();
        }

        pub fn inhibited(&self) -> bool {
            *self.inhibited.lock().unwrap()
        }
    }

    #[async_trait::async_trait]
    impl Logind for FakeLogind {
        async fn current_inhibit_delay(&self) -> Result<Duration, LogindError> {
            Ok(*self.delay.lock().unwrap())
        }
        async fn override_inhibit_delay(&self, delay: Duration) -> Result<(), LogindError> {
            self.overrides.lock().unwrap().push(delay);
            Ok(())
        }
        async fn reload_logind_conf(&self) -> Result<(), LogindError> {
            if let Some(d) = *self.delay_after_reload.lock().unwrap() {
                *self.delay.lock().unwrap() = d;
            }
            Ok(())
        }
        async fn inhibit(&self) -> Result<(), LogindError> {
            *self.inhibited.lock().unwrap() = true;
            *self.inhibits.lock().unwrap() += 1;
            Ok(())
        }
        async fn release(&self) -> Result<(), LogindError> {
            *self.inhibited.lock().unwrap() = false;
            Ok(())
        }
        async fn monitor_shutdown(&self) -> Result<mpsc::Receiver<bool>, LogindError> {
            let (tx, rx) = mpsc::channel(4);
            *self.tx.lock().unwrap() = Some(tx);
            Ok(rx)
        }
    }
}
