//! TokenRequest (`POST .../serviceaccounts/<name>/token`, upstream
//! `pkg/registry/core/serviceaccount/storage/token.go`) and the authenticator for
//! the tokens it issues (upstream `pkg/serviceaccount/claims.go`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::{Store, UserInfo, meta, meta_str, timestamp};
use crate::controlplane::random::new_uid;
use crate::controlplane::resources::{ResourceDef, find};
use crate::controlplane::status::ApiError;

/// The apiserver's issuer and only audience (kubeadm's `--service-account-issuer`).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// Upstream `WarnOnlyBoundTokenExpirationSeconds`.
const WARN_ONLY_SECONDS: i64 = 3607;
/// Upstream `ExpirationExtensionSeconds`: one year.
const EXTENDED_SECONDS: i64 = 365 * 24 * 3600;
const DEFAULT_SECONDS: i64 = 3600;
const MIN_SECONDS: i64 = 600;
/// go-jose's `DefaultLeeway` for time claims.
const LEEWAY: i64 = 60;
const GROUP: &str = "authentication.k8s.io";

/// One served TokenRequest: who asked for which account, bound to which pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequestRecord {
    pub namespace: String,
    pub service_account: String,
    /// The bound pod's name (empty when not pod-bound).
    pub pod: String,
}

fn res(plural: &str) -> &'static ResourceDef {
    find("", "v1", plural).expect("core resource served")
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn invalid(name: &str, field: &str, value: &Value, detail: &str) -> ApiError {
    ApiError::invalid_in_group(GROUP, "TokenRequest", name, field, value, detail)
}

fn name_ref(obj: &Value) -> Value {
    json!({ "name": meta_str(obj, "name"), "uid": meta_str(obj, "uid") })
}

impl Store {
    /// Serve one TokenRequest for `ns/name` from `user`; the answer is the
    /// TokenRequest with `status.token` and `status.expirationTimestamp`.
    pub fn token_request(
        &mut self,
        ns: &str,
        name: &str,
        body: &Value,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        let mut req = if body.is_null() {
            json!({})
        } else {
            body.clone()
        };
        if !req.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a TokenRequest object",
            ));
        }
        if let Some(k) = req.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != "TokenRequest"
        {
            return Err(ApiError::bad_request(format!(
                "kind {k} is not TokenRequest ({GROUP}/v1)"
            )));
        }
        let body_name = meta_str(&req, "name").to_string();
        if !body_name.is_empty() && body_name != name {
            return Err(invalid(
                name,
                "metadata.name",
                &json!(body_name),
                "must match the service account name if specified",
            ));
        }
        let body_ns = meta_str(&req, "namespace").to_string();
        if !body_ns.is_empty() && body_ns != ns {
            return Err(invalid(
                name,
                "metadata.namespace",
                &json!(body_ns),
                "must match the service account namespace if specified",
            ));
        }
        let sa = self.get(res("serviceaccounts"), ns, name)?;
        if !req.get("spec").is_some_and(Value::is_object) {
            req["spec"] = json!({});
        }
        let spec = &mut req["spec"];
        if spec
            .get("audiences")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
        {
            spec["audiences"] = json!([API_AUDIENCE]);
        }
        if spec.get("expirationSeconds").is_none_or(Value::is_null) {
            spec["expirationSeconds"] = json!(DEFAULT_SECONDS);
        }
        let audiences: Vec<String> = spec["audiences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let Some(expiration) = spec["expirationSeconds"].as_i64() else {
            return Err(ApiError::bad_request(
                "spec.expirationSeconds must be an integer",
            ));
        };
        let now = SystemTime::now();
        if expiration < MIN_SECONDS {
            return Err(invalid(
                "",
                "spec.expirationSeconds",
                &json!(expiration),
                "may not specify a duration less than 10 minutes",
            ));
        }
        if expiration > 1 << 32 {
            return Err(invalid(
                "",
                "spec.expirationSeconds",
                &json!(expiration),
                "may not specify a duration larger than 2^32 seconds",
            ));
        }
        self.node_restriction(user, ns, name, &audiences, spec.get("boundObjectRef"))?;
        let bound = self.bound_object(ns, name, spec.get("boundObjectRef"))?;

        let mut exp = expiration;
        let mut warn_after = None;
        let kube_audiences = audiences.iter().all(|a| a == API_AUDIENCE);
        if self.config.extend_token_expiration
            && bound.pod.is_some()
            && expiration == WARN_ONLY_SECONDS
            && kube_audiences
        {
            warn_after = Some(expiration);
            exp = EXTENDED_SECONDS;
        }
        let iat = unix(now);
        let mut k8s = json!({
            "namespace": ns,
            "serviceaccount": name_ref(&sa),
        });
        if let Some(p) = &bound.pod {
            k8s["pod"] = name_ref(p);
        }
        if let Some(s) = &bound.secret {
            k8s["secret"] = name_ref(s);
        }
        if let Some(n) = &bound.node {
            k8s["node"] = n.clone();
        }
        if let Some(w) = warn_after {
            k8s["warnafter"] = json!(iat + w);
        }
        let claims = json!({
            "aud": audiences,
            "exp": iat + exp,
            "iat": iat,
            "iss": API_AUDIENCE,
            "jti": new_uid(),
            "kubernetes.io": k8s,
            "nbf": iat,
            "sub": format!("system:serviceaccount:{ns}:{name}"),
        });
        let signer = self
            .token_signer
            .clone()
            .ok_or_else(|| ApiError::internal("no service-account signing key configured"))?;
        let token = signer
            .sign(&claims)
            .map_err(|e| ApiError::internal(format!("failed to generate token: {e}")))?;
        self.token_requests.push(TokenRequestRecord {
            namespace: ns.to_string(),
            service_account: name.to_string(),
            pod: bound
                .pod
                .as_ref()
                .map(|p| meta_str(p, "name").to_string())
                .unwrap_or_default(),
        });
        let expires = now + Duration::from_secs(u64::try_from(expiration).unwrap_or(0));
        req["kind"] = json!("TokenRequest");
        req["apiVersion"] = json!(format!("{GROUP}/v1"));
        req["metadata"] = json!({
            "name": name,
            "namespace": ns,
            "creationTimestamp": timestamp(now),
        });
        req["status"] = json!({ "token": token, "expirationTimestamp": timestamp(expires) });
        Ok(req)
    }

    /// The NodeRestriction admission plugin on TokenRequests from a kubelet
    /// (`system:node:<name>` in `system:nodes`): only for a pod on that node,
    /// bound to it by name and UID, for the API audience or one the pod's
    /// projected token volumes name (ServiceAccountNodeAudienceRestriction).
    fn node_restriction(
        &self,
        user: &UserInfo,
        ns: &str,
        sa: &str,
        audiences: &[String],
        r: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(node) = user
            .name
            .strip_prefix("system:node:")
            .filter(|_| user.in_group("system:nodes"))
        else {
            return Ok(());
        };
        let deny = |why: String| ApiError::forbidden_because(res("serviceaccounts"), sa, &why);
        let field = |k: &str| {
            r.and_then(|r| r.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        if field("apiVersion") != "v1" || field("kind") != "Pod" || field("name").is_empty() {
            return Err(deny("node requested token not bound to a pod".into()));
        }
        let uid = field("uid");
        if uid.is_empty() {
            return Err(deny(
                "node requested token with a pod binding without a uid".into(),
            ));
        }
        let pod = self.get(res("pods"), ns, field("name"))?;
        if uid != meta_str(&pod, "uid") {
            return Err(deny(format!(
                "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
            )));
        }
        if pod.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
            return Err(deny(
                "node requested token bound to a pod scheduled on a different node".into(),
            ));
        }
        let requested: Vec<&String> = audiences.iter().filter(|a| *a != API_AUDIENCE).collect();
        match requested.as_slice() {
            [] => Ok(()),
            [aud] if audiences.len() == 1 => {
                let in_spec = pod
                    .pointer("/spec/volumes")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
                    .flatten()
                    .any(|s| {
                        s.pointer("/serviceAccountToken/audience")
                            .and_then(Value::as_str)
                            == Some(aud.as_str())
                    });
                if in_spec || self.csi_driver_audience(ns, &pod, aud) {
                    Ok(())
                } else {
                    Err(deny(format!(
                        "audience {aud:?} not found in pod spec volume, {} is not authorized to request tokens for this audience",
                        user.name
                    )))
                }
            }
            _ => Err(deny("node may only request 0 or 1 audiences".into())),
        }
    }

    /// Whether a CSI volume of the pod (inline, or a claim's PV) has a driver whose CSIDriver
    /// object asks for tokens of `aud` (`spec.tokenRequests`), which upstream's node
    /// restriction also allows.
    fn csi_driver_audience(&self, ns: &str, pod: &Value, aud: &str) -> bool {
        let pod_name = meta_str(pod, "name").to_string();
        let drivers = pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| {
                if let Some(d) = v.pointer("/csi/driver").and_then(Value::as_str) {
                    return Some(d.to_string());
                }
                let claim = match v.pointer("/persistentVolumeClaim/claimName") {
                    Some(c) => c.as_str()?.to_string(),
                    None if v.get("ephemeral").is_some() => {
                        format!("{pod_name}-{}", v.get("name")?.as_str()?)
                    }
                    None => return None,
                };
                let pvc = self.get(res("persistentvolumeclaims"), ns, &claim).ok()?;
                let pv_name = pvc.pointer("/spec/volumeName")?.as_str()?.to_string();
                let pv = self.get(res("persistentvolumes"), "", &pv_name).ok()?;
                Some(pv.pointer("/spec/csi/driver")?.as_str()?.to_string())
            });
        drivers.into_iter().any(|d| {
            find("storage.k8s.io", "v1", "csidrivers")
                .and_then(|r| self.get(r, "", &d).ok())
                .and_then(|o| o.pointer("/spec/tokenRequests").cloned())
                .and_then(|t| t.as_array().cloned())
                .into_iter()
                .flatten()
                .any(|t| t.get("audience").and_then(Value::as_str) == Some(aud))
        })
    }

    /// Resolve `spec.boundObjectRef` as upstream does (Pod, Secret or Node).
    fn bound_object(&self, ns: &str, sa_name: &str, r: Option<&Value>) -> Result<Bound, ApiError> {
        let mut out = Bound::default();
        let Some(r) = r.filter(|r| r.is_object()) else {
            return Ok(out);
        };
        let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
        let api_version = r.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let name = r.get("name").and_then(Value::as_str).unwrap_or("");
        let want_uid = r.get("uid").and_then(Value::as_str).unwrap_or("");
        let uid = match (group, kind) {
            ("", "Pod") => {
                let pod = self.get(res("pods"), ns, name)?;
                let pod_sa = pod
                    .pointer("/spec/serviceAccountName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if pod_sa != sa_name {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token for serviceaccount {sa_name:?} to pod running with different serviceaccount name."
                    )));
                }
                let node = pod
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !node.is_empty() {
                    out.node = Some(match self.lookup(res("nodes"), "", node) {
                        Some(n) => name_ref(n),
                        None => json!({ "name": node }),
                    });
                }
                let uid = meta_str(&pod, "uid").to_string();
                out.pod = Some(pod);
                uid
            }
            ("", "Secret") => {
                let secret = self.get(res("secrets"), ns, name)?;
                let uid = meta_str(&secret, "uid").to_string();
                out.secret = Some(secret);
                uid
            }
            ("", "Node") => {
                let node = self.get(res("nodes"), "", name)?;
                let uid = meta_str(&node, "uid").to_string();
                out.node = Some(name_ref(&node));
                uid
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token to object of type {group}/{version}, Kind={kind}"
                )));
            }
        };
        if !want_uid.is_empty() && want_uid != uid {
            return Err(ApiError {
                details: Some(json!({ "name": name, "kind": kind })),
                ..ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {kind} \"{name}\": the UID in the bound object reference ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
                    ),
                )
            });
        }
        Ok(out)
    }

    /// The claims of a token this control plane issued, after checking its
    /// signature, issuer and time window (with upstream's one-minute leeway).
    pub fn verify_token(&self, token: &str) -> Result<Value, String> {
        let signer = self
            .token_signer
            .as_ref()
            .ok_or("no service-account signing key configured")?;
        let claims = signer.verify(token).map_err(|e| e.to_string())?;
        if claims.get("iss").and_then(Value::as_str) != Some(API_AUDIENCE) {
            return Err(format!("unexpected issuer {}", claims["iss"]));
        }
        let now = unix(SystemTime::now());
        let num = |k: &str| claims.get(k).and_then(Value::as_i64);
        match (num("exp"), num("nbf"), num("iat")) {
            (Some(exp), _, _) if now > exp + LEEWAY => {
                Err("service account token has expired".into())
            }
            (_, Some(nbf), _) if now + LEEWAY < nbf => {
                Err("service account token is not valid yet".into())
            }
            (_, _, Some(iat)) if now + LEEWAY < iat => {
                Err("service account token is issued in the future".into())
            }
            (None, _, _) => Err("service account token has no expiry".into()),
            _ => Ok(claims),
        }
    }

    /// The user a bearer token stands for, when it is a valid service-account
    /// token for one of the apiserver's audiences whose account (and bound pod)
    /// still exist with the same UIDs.
    pub fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        let claims = self.verify_token(token).ok()?;
        let aud_ok = match claims.get("aud") {
            Some(Value::String(a)) => a == API_AUDIENCE,
            Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(API_AUDIENCE)),
            _ => false,
        };
        if !aud_ok {
            return None;
        }
        let k = claims.get("kubernetes.io")?;
        let ns = k.get("namespace")?.as_str()?;
        let sa_name = k.pointer("/serviceaccount/name")?.as_str()?;
        let sa = self.lookup(res("serviceaccounts"), ns, sa_name)?;
        if k.pointer("/serviceaccount/uid")?.as_str()? != meta_str(sa, "uid") {
            return None;
        }
        for (kind, plural) in [("pod", "pods"), ("secret", "secrets")] {
            if let Some(r) = k.get(kind) {
                let obj = self.lookup(res(plural), ns, r.get("name")?.as_str()?)?;
                let deleted_before = meta(obj, "deletionTimestamp")
                    .and_then(Value::as_str)
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .is_some_and(|t| t.as_second() < unix(SystemTime::now()) - LEEWAY);
                if r.get("uid")?.as_str()? != meta_str(obj, "uid") || deleted_before {
                    return None;
                }
            }
        }
        Some(UserInfo::new(
            &format!("system:serviceaccount:{ns}:{sa_name}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{ns}"),
                "system:authenticated",
            ],
        ))
    }
}

/// The objects a token is bound to.
#[derive(Debug, Default)]
struct Bound {
    pod: Option<Value>,
    secret: Option<Value>,
    node: Option<Value>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::controlplane::jwt::TokenSigner;
    use crate::controlplane::store::StoreConfig;

    fn store(extend: bool) -> Store {
        let mut s = Store::new(StoreConfig {
            history: 10,
            auto_approve_csrs: false,
            auto_approve_serving_csrs: false,
            cluster_signing_duration: Duration::from_secs(3600),
            min_signing_duration: Duration::from_secs(600),
            cert_backdate: Duration::ZERO,
            service_account_admission: true,
            extend_token_expiration: extend,
        });
        s.token_signer = Some(Arc::new(TokenSigner::generate().unwrap()));
        let admin = UserInfo::new("admin", &["system:masters"]);
        let sa = json!({"metadata": {"name": "default", "namespace": "d"}});
        s.create(res("serviceaccounts"), "d", sa, &admin).unwrap();
        let pod = json!({"metadata": {"name": "p", "namespace": "d"},
                         "spec": {"containers": [{"name": "c", "image": "i:1"}]}});
        s.create(res("pods"), "d", pod, &admin).unwrap();
        s
    }

    fn lifetime(s: &mut Store) -> (i64, bool) {
        let uid = meta_str(&s.get(res("pods"), "d", "p").unwrap(), "uid").to_string();
        let body = json!({"spec": {"expirationSeconds": 3607,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": uid}}});
        let admin = UserInfo::new("admin", &["system:masters"]);
        let tr = s.token_request("d", "default", &body, &admin).unwrap();
        let c = s
            .verify_token(tr["status"]["token"].as_str().unwrap())
            .unwrap();
        let life = c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap();
        (life, c["kubernetes.io"].get("warnafter").is_some())
    }

    #[test]
    fn extension_follows_the_apiserver_flag() {
        assert_eq!(lifetime(&mut store(true)), (EXTENDED_SECONDS, true));
        assert_eq!(lifetime(&mut store(false)), (3607, false));
    }

    #[test]
    fn expired_and_foreign_tokens_are_refused() {
        let s = store(true);
        let signer = s.token_signer.clone().unwrap();
        let now = unix(SystemTime::now());
        let claims = |iat: i64, exp: i64| {
            json!({"iss": API_AUDIENCE, "aud": [API_AUDIENCE], "iat": iat, "nbf": iat, "exp": exp,
                   "sub": "system:serviceaccount:d:default",
                   "kubernetes.io": {"namespace": "d", "serviceaccount": {"name": "default", "uid": "x"}}})
        };
        let expired = signer.sign(&claims(now - 7200, now - 3600)).unwrap();
        assert_eq!(
            s.verify_token(&expired).unwrap_err(),
            "service account token has expired"
        );
        // Valid in time and signature, but the account's UID differs: no user.
        let stale = signer.sign(&claims(now, now + 600)).unwrap();
        assert!(s.verify_token(&stale).is_ok());
        assert_eq!(s.authenticate_token(&stale), None);
        let other = TokenSigner::generate().unwrap();
        assert!(
            s.verify_token(&other.sign(&claims(now, now + 600)).unwrap())
                .is_err()
        );
    }
}
