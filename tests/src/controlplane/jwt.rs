//! The service-account token signer: compact JWS (ES256, P-256) over JSON claims,
//! with a `kid` derived from the public key as kube-apiserver derives it
//! (unpadded base64url of the SHA-256 of the PKIX public key).

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use serde_json::{Value, json};

/// DER prefix of a P-256 `SubjectPublicKeyInfo` in front of the 65-byte point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The control plane's service-account signing key.
pub struct TokenSigner {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    kid: String,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl TokenSigner {
    /// A fresh P-256 key.
    pub fn generate() -> Result<Self> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| anyhow!("generating the service-account key failed"))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|e| anyhow!("loading the service-account key: {e}"))?;
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(key.public_key().as_ref());
        let kid = B64URL.encode(ring::digest::digest(&ring::digest::SHA256, &spki));
        Ok(Self { key, rng, kid })
    }

    /// The public key as a JWK Set (what `/openid/v1/jwks` serves).
    pub fn jwks(&self) -> Value {
        let point = self.key.public_key().as_ref();
        json!({"keys": [{
            "use": "sig",
            "kty": "EC",
            "kid": self.kid,
            "crv": "P-256",
            "alg": "ES256",
            "x": B64URL.encode(&point[1..33]),
            "y": B64URL.encode(&point[33..65]),
        }]})
    }

    /// Sign `claims` into a compact JWS.
    pub fn sign(&self, claims: &Value) -> Result<String> {
        let header = json!({ "alg": "ES256", "kid": self.kid });
        let input = format!(
            "{}.{}",
            B64URL.encode(serde_json::to_vec(&header)?),
            B64URL.encode(serde_json::to_vec(claims)?)
        );
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .map_err(|_| anyhow!("signing the token failed"))?;
        Ok(format!("{input}.{}", B64URL.encode(sig.as_ref())))
    }

    /// Check the header and signature of a compact JWS made by [`sign`](Self::sign)
    /// and return its claims (no time or audience checks).
    pub fn verify(&self, token: &str) -> Result<Value> {
        let mut parts = token.split('.');
        let (Some(h), Some(c), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            bail!("not a compact JWS (three dot-separated parts expected)");
        };
        let header: Value = serde_json::from_slice(&B64URL.decode(h).context("header")?)
            .context("header is not JSON")?;
        if header.get("alg").and_then(Value::as_str) != Some("ES256") {
            bail!("unexpected signing algorithm {}", header["alg"]);
        }
        let sig = B64URL.decode(s).context("signature")?;
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, self.key.public_key().as_ref())
            .verify(format!("{h}.{c}").as_bytes(), &sig)
            .map_err(|_| anyhow!("invalid signature"))?;
        serde_json::from_slice(&B64URL.decode(c).context("claims")?).context("claims are not JSON")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_tokens_verify_and_tampered_ones_do_not() {
        let s = TokenSigner::generate().unwrap();
        let t = s.sign(&json!({"sub": "a"})).unwrap();
        assert_eq!(s.verify(&t).unwrap()["sub"], "a");
        let mut parts: Vec<&str> = t.split('.').collect();
        let forged = B64URL.encode(br#"{"sub":"b"}"#);
        parts[1] = &forged;
        assert!(s.verify(&parts.join(".")).is_err());
        let other = TokenSigner::generate().unwrap();
        assert!(other.verify(&t).is_err(), "another key must not verify it");
        assert_ne!(s.kid, other.kid);
    }
}
