//! Credentials for the test control plane's users: kubeconfigs with client certificates or
//! tokens (admin, bootstrap, node), static tokens, and SubjectAccessReview grants.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use super::{
    BOOTSTRAP_TOKEN, IssuedCert, TestControlPlane, UserInfo, reviews, write_file, yaml_quote,
};

impl TestControlPlane {
    fn kubeconfig(&self, cluster: &str, user: &str, auth: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    server: {server}\n  name: {cluster}\ncontexts:\n- context:\n    cluster: {cluster}\n    user: {user}\n  name: {user}@{cluster}\ncurrent-context: {user}@{cluster}\npreferences: {{}}\nusers:\n- name: {user}\n  user:\n{auth}",
            ca = B64.encode(self.ca_pem()),
            server = self.url(),
        )
    }

    /// Kubeconfig text with an embedded client certificate.
    pub fn cert_kubeconfig_yaml(&self, cert: &IssuedCert, user: &str) -> String {
        let auth = format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            B64.encode(&cert.cert_pem),
            B64.encode(&cert.key_pem)
        );
        self.kubeconfig("kubernetes", user, &auth)
    }

    /// Kubeconfig text with a bearer token.
    pub fn token_kubeconfig_yaml(&self, token: &str, user: &str) -> String {
        self.kubeconfig(
            "kubernetes",
            user,
            &format!("    token: {}\n", yaml_quote(token)),
        )
    }

    /// An admin kubeconfig (client cert CN=admin, O=system:masters) at `path`.
    pub fn admin_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        let cert = self.issue_client_cert(
            "admin",
            &["system:masters"],
            Duration::from_secs(365 * 24 * 3600),
        )?;
        write_file(
            path.as_ref(),
            &self.cert_kubeconfig_yaml(&cert, "kubernetes-admin"),
        )
    }

    /// kubeadm's `bootstrap-kubelet.conf`: user `tls-bootstrap-token-user`, token
    /// `abcdef.0123456789abcdef` (the first configured bootstrap token).
    pub fn bootstrap_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        let token = self
            .shared
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(_, u)| u.in_group("system:bootstrappers"))
            .map(|(t, _)| t.clone())
            .unwrap_or_else(|| BOOTSTRAP_TOKEN.to_string());
        write_file(
            path.as_ref(),
            &self.token_kubeconfig_yaml(&token, "tls-bootstrap-token-user"),
        )
    }

    /// A kubelet kubeconfig as TLS bootstrap would leave it: CN=system:node:<node>, O=system:nodes.
    pub fn node_kubeconfig(
        &self,
        path: impl AsRef<Path>,
        node: &str,
        lifetime: Duration,
    ) -> Result<IssuedCert> {
        let cert =
            self.issue_client_cert(&format!("system:node:{node}"), &["system:nodes"], lifetime)?;
        write_file(
            path.as_ref(),
            &self.cert_kubeconfig_yaml(&cert, "default-auth"),
        )?;
        Ok(cert)
    }

    /// Accept `token` as user `user` in `groups` (e.g. a kube-proxy service account token).
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut g: Vec<&str> = groups.to_vec();
        g.push("system:authenticated");
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_string(), UserInfo::new(user, &g));
    }

    /// SubjectAccessReview allows `subject` (a user or group) `verb` on `nodes/<subresource>`
    /// (`*` for any verb or subresource); anything not granted is denied.
    pub fn grant(&self, subject: &str, verb: &str, subresource: &str) {
        self.shared.grants.add(reviews::Grant {
            subject: subject.into(),
            verb: verb.into(),
            subresource: subresource.into(),
        });
    }

    /// Drop every SubjectAccessReview grant.
    pub fn clear_grants(&self) {
        self.shared.grants.clear();
    }

    /// Stop accepting a token.
    pub fn remove_token(&self, token: &str) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token);
    }

    /// kubeadm's kube-proxy credentials: the `kube-system/kube-proxy` ServiceAccount (created
    /// here if missing, as kubeadm's kube-proxy addon does), which kubeadm's
    /// `kubeadm:node-proxier` binding gives `system:node-proxier`, with a token that
    /// authenticates as it, in a kubeconfig at `path`.
    pub fn kube_proxy_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        let sa =
            serde_json::json!({"metadata": {"name": "kube-proxy", "namespace": "kube-system"}});
        if self
            .get("serviceaccounts", "kube-system", "kube-proxy")
            .is_none()
        {
            self.create("serviceaccounts", sa)
                .map_err(|e| anyhow::anyhow!("creating kube-system/kube-proxy: {e}"))?;
        }
        let token = "kube-proxy-sa-token.0123456789abcdef";
        self.add_token(
            token,
            "system:serviceaccount:kube-system:kube-proxy",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
            ],
        );
        write_file(
            path.as_ref(),
            &self.token_kubeconfig_yaml(token, "kube-proxy"),
        )
    }

    /// Grant `verbs` on `resources` of `api_group` to a group (`group`) or user, as an admin
    /// would with a ClusterRole and a ClusterRoleBinding.
    pub fn bind_cluster_role(
        &self,
        subject: &str,
        group: bool,
        verbs: &[&str],
        api_group: &str,
        resources: &[&str],
    ) {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        self.shared
            .rbac
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(super::authz::rbac::RuntimeBinding {
                subject: subject.into(),
                group,
                verbs: own(verbs),
                api_group: api_group.into(),
                resources: own(resources),
            });
    }
}
