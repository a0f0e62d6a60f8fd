//! The router's state in SQLite: registered models with their files, nodes, API keys, the
//! stored responses of `/v1/responses`, and the nodes' engine benchmarks of the models.
//!
//! Portable schema (plain TEXT/BIGINT columns, no SQLite-only types or upserts that PostgreSQL
//! lacks) so a PostgreSQL store can follow for several routers. Migrations are numbered and
//! recorded in `PRAGMA user_version`; each runs in a transaction.
//!
//! Calls are short and run under one mutex; a router's write rate (registrations, heartbeats
//! are kept in memory) is far below what that serializes.

use llmr_cluster::{ManifestFile, ModelFormat, ModelManifest, ModelSource};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::Mutex;

mod benchmarks;
mod responses;
pub use benchmarks::StoredBenchmark;
pub use responses::StoredResponse;

const MIGRATIONS: &[&str] = &[
    // 1: models, their files, nodes, API keys.
    "CREATE TABLE models (
        name TEXT PRIMARY KEY,
        format TEXT NOT NULL,
        source TEXT NOT NULL,
        primary_file TEXT NOT NULL,
        quantization TEXT,
        architecture TEXT,
        has_chat_template BIGINT NOT NULL,
        registered_at BIGINT NOT NULL
    );
    CREATE TABLE model_files (
        model_name TEXT NOT NULL REFERENCES models(name) ON DELETE CASCADE,
        path TEXT NOT NULL,
        size BIGINT NOT NULL,
        sha256 TEXT NOT NULL,
        PRIMARY KEY (model_name, path)
    );
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        url TEXT NOT NULL,
        info TEXT NOT NULL,
        registered_at BIGINT NOT NULL
    );
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        hash TEXT NOT NULL UNIQUE,
        scopes TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        revoked_at BIGINT
    );",
    // 2: stored responses of `/v1/responses`, each visible to the key that made it.
    "CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        model TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        input TEXT NOT NULL,
        response TEXT NOT NULL
    );
    CREATE INDEX responses_by_age ON responses (created_at);",
    // 3: a response continuing another stores only its own input and points at the other
    // (NULL: `input` holds the whole conversation, as every row of version 2 does).
    "ALTER TABLE responses ADD COLUMN previous_id TEXT;
    CREATE INDEX responses_by_previous ON responses (previous_id);",
    // 4: each node's benchmarks of a registered model, one per engine (spec 000).
    "CREATE TABLE model_benchmarks (
        model_name TEXT NOT NULL REFERENCES models(name) ON DELETE CASCADE,
        node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
        engine_id TEXT NOT NULL,
        engine_version TEXT NOT NULL,
        tokens_per_second REAL NOT NULL,
        ttft_ms REAL NOT NULL,
        peak_memory_bytes BIGINT NOT NULL,
        measured_at BIGINT NOT NULL,
        PRIMARY KEY (model_name, node_id, engine_id)
    );",
];

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0} already exists")]
    Exists(String),
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("database holds an unreadable row: {0}")]
    Corrupt(String),
}

pub struct Db {
    conn: Mutex<Connection>,
}

/// A stored API key (never the key itself: its sha256).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredKey {
    pub id: String,
    pub name: String,
    /// The first characters of the key, to tell keys apart in listings.
    pub prefix: String,
    pub hash: String,
    pub scopes: Vec<String>,
    pub created_at: u64,
    pub revoked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredNode {
    pub id: String,
    pub name: String,
    pub url: String,
    /// The registration JSON (machine, GPUs, runtimes).
    pub info: String,
    pub registered_at: u64,
}

impl Db {
    /// Opens (creating) the database file and its parent directory, and migrates it.
    pub fn open(path: &Path) -> Result<Db, DbError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| DbError::Sqlite(rusqlite::Error::InvalidPath(format!("{}: {e}", dir.display()).into())))?;
        }
        Self::init(Connection::open(path)?)
    }

    pub fn open_in_memory() -> Result<Db, DbError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Db, DbError> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: usize = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", i + 1)?;
            tx.commit()?;
        }
        Ok(Db { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (transactions roll back).
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn schema_version(&self) -> usize {
        self.conn().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap_or(0)
    }

    // ---- models ----

    pub fn insert_model(&self, m: &ModelManifest) -> Result<(), DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let exists: Option<String> =
            tx.query_row("SELECT name FROM models WHERE name = ?1", [&m.name], |r| r.get(0)).optional()?;
        if exists.is_some() {
            return Err(DbError::Exists(format!("model '{}'", m.name)));
        }
        let source = serde_json::to_string(&m.source).expect("serializable");
        tx.execute(
            "INSERT INTO models (name, format, source, primary_file, quantization, architecture, has_chat_template, registered_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                m.name,
                m.format.as_str(),
                source,
                m.primary,
                m.quantization,
                m.architecture,
                m.has_chat_template as i64,
                m.registered_at as i64
            ],
        )?;
        for f in &m.files {
            tx.execute(
                "INSERT INTO model_files (model_name, path, size, sha256) VALUES (?1, ?2, ?3, ?4)",
                params![m.name, f.path, f.size as i64, f.sha256],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn models(&self) -> Result<Vec<ModelManifest>, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT name, format, source, primary_file, quantization, architecture, has_chat_template, registered_at
             FROM models ORDER BY name",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, Option<String>>(5)?,
                r.get::<_, i64>(6)?,
                r.get::<_, i64>(7)?,
            ))
        })?;
        let mut files_stmt =
            conn.prepare("SELECT path, size, sha256 FROM model_files WHERE model_name = ?1 ORDER BY path")?;
        let mut out = Vec::new();
        for row in rows {
            let (name, format, source, primary, quantization, architecture, chat, at) = row?;
            let format = ModelFormat::parse(&format)
                .ok_or_else(|| DbError::Corrupt(format!("model '{name}': format {format:?}")))?;
            let source: ModelSource =
                serde_json::from_str(&source).map_err(|e| DbError::Corrupt(format!("model '{name}': source: {e}")))?;
            let files = files_stmt
                .query_map([&name], |r| {
                    Ok(ManifestFile { path: r.get(0)?, size: r.get::<_, i64>(1)? as u64, sha256: r.get(2)? })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            out.push(ModelManifest {
                name,
                format,
                source,
                files,
                primary,
                quantization,
                architecture,
                has_chat_template: chat != 0,
                registered_at: at as u64,
            });
        }
        Ok(out)
    }

    pub fn model(&self, name: &str) -> Result<Option<ModelManifest>, DbError> {
        Ok(self.models()?.into_iter().find(|m| m.name == name))
    }

    /// `true` when a model of that name existed.
    pub fn delete_model(&self, name: &str) -> Result<bool, DbError> {
        Ok(self.conn().execute("DELETE FROM models WHERE name = ?1", [name])? > 0)
    }

    // ---- nodes ----

    /// Registers a node, or updates the node of the same name (a restarted node keeps its id).
    pub fn upsert_node(
        &self,
        name: &str,
        url: &str,
        info: &str,
        now: u64,
        new_id: &str,
    ) -> Result<StoredNode, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let existing: Option<(String, i64)> = tx
            .query_row("SELECT id, registered_at FROM nodes WHERE name = ?1", [name], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let node = match existing {
            Some((id, registered_at)) => {
                tx.execute("UPDATE nodes SET url = ?1, info = ?2 WHERE id = ?3", params![url, info, id])?;
                StoredNode {
                    id,
                    name: name.into(),
                    url: url.into(),
                    info: info.into(),
                    registered_at: registered_at as u64,
                }
            }
            None => {
                tx.execute(
                    "INSERT INTO nodes (id, name, url, info, registered_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![new_id, name, url, info, now as i64],
                )?;
                StoredNode {
                    id: new_id.into(),
                    name: name.into(),
                    url: url.into(),
                    info: info.into(),
                    registered_at: now,
                }
            }
        };
        tx.commit()?;
        Ok(node)
    }

    pub fn nodes(&self) -> Result<Vec<StoredNode>, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT id, name, url, info, registered_at FROM nodes ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok(StoredNode {
                id: r.get(0)?,
                name: r.get(1)?,
                url: r.get(2)?,
                info: r.get(3)?,
                registered_at: r.get::<_, i64>(4)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn delete_node(&self, id: &str) -> Result<bool, DbError> {
        Ok(self.conn().execute("DELETE FROM nodes WHERE id = ?1", [id])? > 0)
    }

    // ---- API keys ----

    pub fn insert_key(&self, key: &StoredKey) -> Result<(), DbError> {
        self.conn().execute(
            "INSERT INTO api_keys (id, name, prefix, hash, scopes, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![key.id, key.name, key.prefix, key.hash, key.scopes.join(","), key.created_at as i64],
        )?;
        Ok(())
    }

    pub fn keys(&self) -> Result<Vec<StoredKey>, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT id, name, prefix, hash, scopes, created_at, revoked_at FROM api_keys ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(StoredKey {
                id: r.get(0)?,
                name: r.get(1)?,
                prefix: r.get(2)?,
                hash: r.get(3)?,
                scopes: r.get::<_, String>(4)?.split(',').filter(|s| !s.is_empty()).map(String::from).collect(),
                created_at: r.get::<_, i64>(5)? as u64,
                revoked: r.get::<_, Option<i64>>(6)?.is_some(),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn revoke_key(&self, id: &str, now: u64) -> Result<bool, DbError> {
        Ok(self.conn().execute(
            "UPDATE api_keys SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
            params![now as i64, id],
        )? > 0)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn manifest(name: &str) -> ModelManifest {
        ModelManifest {
            name: name.into(),
            format: ModelFormat::Gguf,
            source: ModelSource::Hub {
                endpoint: "http://127.0.0.1:1".into(),
                repo: "o/r".into(),
                revision: "main".into(),
            },
            files: vec![ManifestFile { path: "m.gguf".into(), size: 10, sha256: "ab".repeat(32) }],
            primary: "m.gguf".into(),
            quantization: Some("Q4_1".into()),
            architecture: Some("llama".into()),
            has_chat_template: true,
            registered_at: 1,
        }
    }

    #[test]
    fn models_round_trip_through_a_real_file_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/router.db");
        {
            let db = Db::open(&path).unwrap();
            db.insert_model(&manifest("a")).unwrap();
            assert!(matches!(db.insert_model(&manifest("a")), Err(DbError::Exists(_))));
        }
        let db = Db::open(&path).unwrap();
        assert_eq!(db.schema_version(), MIGRATIONS.len());
        assert_eq!(db.models().unwrap(), vec![manifest("a")]);
        assert!(db.delete_model("a").unwrap());
        assert!(!db.delete_model("a").unwrap());
        assert!(db.models().unwrap().is_empty());
    }

    #[test]
    fn a_node_that_registers_again_keeps_its_id() {
        let db = Db::open_in_memory().unwrap();
        let a = db.upsert_node("n1", "http://127.0.0.1:1", "{}", 5, "id-1").unwrap();
        let b = db.upsert_node("n1", "http://127.0.0.1:2", "{}", 9, "id-2").unwrap();
        assert_eq!(a.id, b.id);
        assert_eq!(b.registered_at, 5);
        assert_eq!(db.nodes().unwrap()[0].url, "http://127.0.0.1:2");
    }
}
