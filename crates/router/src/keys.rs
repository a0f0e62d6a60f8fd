//! API keys: `llmr_` + 40 random base62 characters (238 bits), stored as their sha256 (a fast hash
//! is right for a random secret of that size: there is nothing to brute-force), shown once.

use crate::db::{Db, DbError, StoredKey};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

const KEY_PREFIX: &str = "llmr_";
const KEY_CHARS: usize = 40;
const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// What a key may do. `admin` implies the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// `/v1/*`: the OpenAI API.
    Api,
    /// `/v0/nodes*` and manifests: what a node needs.
    Node,
    /// Everything under `/v0`.
    Admin,
}

impl Scope {
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "api" => Some(Scope::Api),
            "node" => Some(Scope::Node),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Api => "api",
            Scope::Node => "node",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key as a request presents it, once verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub key_id: String,
    pub name: String,
    pub scopes: Vec<Scope>,
}

impl Principal {
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.iter().any(|s| *s == scope || *s == Scope::Admin)
    }
}

pub fn hash_key(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` random characters of [0-9A-Za-z] from the OS generator (rejection sampling: no bias).
pub fn random_token(n: usize) -> String {
    let mut out = String::with_capacity(n);
    let mut buf = [0u8; 64];
    while out.len() < n {
        getrandom::fill(&mut buf).expect("the OS random generator is available");
        for b in buf {
            // 248 = 62 * 4: bytes above it would favour the first characters.
            if b < 248 && out.len() < n {
                out.push(ALPHABET[(b % 62) as usize] as char);
            }
        }
    }
    out
}

/// The keys of a router: the database is the truth; verification reads an in-memory map of
/// hashes, rebuilt on every change, so a request never waits on SQLite.
pub struct KeyRing {
    by_hash: RwLock<HashMap<String, Principal>>,
    /// When an unknown key last made us re-read the database (`llmr keys create` writes to it
    /// behind a running router); at most once per [`MISS_RELOAD_INTERVAL`], so unknown keys
    /// cannot turn into a database load.
    last_miss_reload: Mutex<Option<Instant>>,
    /// Keys given on the command line (`llmr serve --api-key`, the embedded node's token):
    /// valid for this process only, never written to the database.
    fixed: HashMap<String, Principal>,
}

const MISS_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// A key just created: the only time the secret exists outside the client.
#[derive(Clone, Debug)]
pub struct NewKey {
    pub id: String,
    pub secret: String,
    pub scopes: Vec<Scope>,
}

impl KeyRing {
    pub fn load(db: &Db) -> Result<KeyRing, DbError> {
        Self::with_fixed(db, &[])
    }

    /// The database's keys plus `fixed` ones: (secret, name, scopes).
    pub fn with_fixed(db: &Db, fixed: &[(String, String, Vec<Scope>)]) -> Result<KeyRing, DbError> {
        let fixed = fixed
            .iter()
            .map(|(secret, name, scopes)| {
                let p = Principal { key_id: format!("fixed:{name}"), name: name.clone(), scopes: scopes.clone() };
                (hash_key(secret), p)
            })
            .collect();
        let ring = KeyRing { by_hash: RwLock::new(HashMap::new()), last_miss_reload: Mutex::new(None), fixed };
        ring.reload(db)?;
        Ok(ring)
    }

    pub fn reload(&self, db: &Db) -> Result<(), DbError> {
        let mut map: HashMap<String, Principal> = db
            .keys()?
            .into_iter()
            .filter(|k| !k.revoked)
            .map(|k| {
                let scopes = k.scopes.iter().filter_map(|s| Scope::parse(s)).collect();
                (k.hash, Principal { key_id: k.id, name: k.name, scopes })
            })
            .collect();
        map.extend(self.fixed.iter().map(|(h, p)| (h.clone(), p.clone())));
        *self.by_hash.write().unwrap_or_else(|p| p.into_inner()) = map;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.read().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// The principal of a presented key. The map lookup is by the key's hash, so timing reveals
    /// nothing about stored keys.
    pub fn verify(&self, db: &Db, presented: &str) -> Option<Principal> {
        let hash = hash_key(presented);
        let found = self.by_hash.read().unwrap_or_else(|p| p.into_inner()).get(&hash).cloned();
        if found.is_some() {
            return found;
        }
        {
            let mut last = self.last_miss_reload.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < MISS_RELOAD_INTERVAL) {
                return None;
            }
            *last = Some(Instant::now());
        }
        if let Err(e) = self.reload(db) {
            tracing::error!("re-reading API keys: {e}");
        }
        self.by_hash.read().unwrap_or_else(|p| p.into_inner()).get(&hash).cloned()
    }

    pub fn create(&self, db: &Db, name: &str, scopes: &[Scope], now: u64) -> Result<NewKey, DbError> {
        let secret = format!("{KEY_PREFIX}{}", random_token(KEY_CHARS));
        let id = format!("key_{}", random_token(12));
        let mut scopes = scopes.to_vec();
        scopes.sort();
        scopes.dedup();
        db.insert_key(&StoredKey {
            id: id.clone(),
            name: name.to_string(),
            prefix: secret[..KEY_PREFIX.len() + 4].to_string(),
            hash: hash_key(&secret),
            scopes: scopes.iter().map(|s| s.as_str().to_string()).collect(),
            created_at: now,
            revoked: false,
        })?;
        self.reload(db)?;
        Ok(NewKey { id, secret, scopes })
    }

    pub fn revoke(&self, db: &Db, id: &str, now: u64) -> Result<bool, DbError> {
        let revoked = db.revoke_key(id, now)?;
        self.reload(db)?;
        Ok(revoked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_verify_by_hash_and_revocation_takes_effect() {
        let db = Db::open_in_memory().unwrap();
        let ring = KeyRing::load(&db).unwrap();
        assert!(ring.is_empty());
        let k = ring.create(&db, "ci", &[Scope::Api, Scope::Api], 1).unwrap();
        assert!(k.secret.starts_with("llmr_") && k.secret.len() == 45);
        assert_eq!(k.scopes, vec![Scope::Api]);
        let p = ring.verify(&db, &k.secret).unwrap();
        assert!(p.allows(Scope::Api) && !p.allows(Scope::Admin) && !p.allows(Scope::Node));
        assert!(ring.verify(&db, "llmr_wrong").is_none());
        // Only the hash is stored.
        assert!(db.keys().unwrap().iter().all(|s| s.hash == hash_key(&k.secret) && !s.hash.contains(&k.secret)));
        assert!(ring.revoke(&db, &k.id, 2).unwrap());
        assert!(ring.verify(&db, &k.secret).is_none());
        // A key written by another process (the CLI) is found on its first use.
        let other = KeyRing::load(&db).unwrap().create(&db, "cli", &[Scope::Node], 3).unwrap();
        *ring.last_miss_reload.lock().unwrap() = None;
        assert!(ring.verify(&db, &other.secret).is_some_and(|p| p.allows(Scope::Node)));
    }

    #[test]
    fn fixed_keys_work_without_being_stored() {
        let db = Db::open_in_memory().unwrap();
        let ring = KeyRing::with_fixed(&db, &[("s3cret".into(), "cli".into(), vec![Scope::Api])]).unwrap();
        assert!(!ring.is_empty());
        assert!(ring.verify(&db, "s3cret").is_some_and(|p| p.allows(Scope::Api) && !p.allows(Scope::Admin)));
        ring.create(&db, "other", &[Scope::Node], 1).unwrap();
        assert!(ring.verify(&db, "s3cret").is_some(), "a reload keeps fixed keys");
        assert_eq!(db.keys().unwrap().len(), 1);
    }

    #[test]
    fn admin_implies_every_scope_and_tokens_are_random() {
        let p = Principal { key_id: "k".into(), name: "n".into(), scopes: vec![Scope::Admin] };
        assert!(p.allows(Scope::Api) && p.allows(Scope::Node));
        let a = random_token(40);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, random_token(40));
    }
}
