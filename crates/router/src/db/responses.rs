//! Stored responses of `/v1/responses`, as a chain: a response that continues another
//! (`previous_response_id`) stores only its own input items and the id of the one it continues,
//! so a conversation of N turns takes space in proportion to N, not N² (each turn storing every
//! earlier one again). Reading one back walks its chain in one recursive query.
//!
//! A chain never breaks: before a response is deleted or expires, the responses continuing it
//! get their whole conversation written into their own row (and point at nothing).

use super::{Db, DbError};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::Value;

/// A response kept for `previous_response_id` and `GET /v1/responses/{id}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    pub id: String,
    /// The id of the API key that made it ("" when the router runs without keys).
    pub owner: String,
    pub model: String,
    pub created_at: u64,
    /// The input items of this request (a JSON array): after `previous_id`'s conversation and
    /// answer when set, else the whole conversation.
    pub input: String,
    /// The response object (JSON).
    pub response: String,
    /// The response this one continues.
    pub previous_id: Option<String>,
}

const COLUMNS: &str = "id, owner, model, created_at, input, response, previous_id";

fn row(r: &Row<'_>) -> rusqlite::Result<StoredResponse> {
    Ok(StoredResponse {
        id: r.get(0)?,
        owner: r.get(1)?,
        model: r.get(2)?,
        created_at: r.get::<_, i64>(3)? as u64,
        input: r.get(4)?,
        response: r.get(5)?,
        previous_id: r.get(6)?,
    })
}

fn items(json: &str, what: &str, id: &str) -> Result<Vec<Value>, DbError> {
    serde_json::from_str(json).map_err(|e| DbError::Corrupt(format!("the {what} of response {id}: {e}")))
}

/// The output items of a stored response object.
fn output_items(r: &StoredResponse) -> Result<Vec<Value>, DbError> {
    let object: Value = serde_json::from_str(&r.response)
        .map_err(|e| DbError::Corrupt(format!("the response object of {}: {e}", r.id)))?;
    Ok(object.get("output").and_then(Value::as_array).cloned().unwrap_or_default())
}

/// Response `id` of `owner` with every input item it answered, earlier turns' first: each
/// earlier response's input then its output, then its own input.
fn conversation(conn: &Connection, id: &str, owner: &str) -> Result<Option<(StoredResponse, Vec<Value>)>, DbError> {
    let mut stmt = conn.prepare_cached(&format!(
        "WITH RECURSIVE chain(id, depth) AS (
            SELECT id, 0 FROM responses WHERE id = ?1 AND owner = ?2
            UNION ALL
            SELECT r.previous_id, chain.depth + 1 FROM responses r JOIN chain ON r.id = chain.id
            WHERE r.previous_id IS NOT NULL
        )
        SELECT {COLUMNS} FROM chain JOIN responses USING (id) WHERE owner = ?2 ORDER BY depth DESC"
    ))?;
    let chain: Vec<StoredResponse> = stmt.query_map(params![id, owner], row)?.collect::<Result<_, _>>()?;
    let Some((target, earlier)) = chain.split_last() else { return Ok(None) };
    if let Some(gone) = chain.first().and_then(|oldest| oldest.previous_id.as_ref()) {
        return Err(DbError::Corrupt(format!("response {id} continues {gone}, which is no longer stored")));
    }
    let mut all = Vec::new();
    for r in earlier {
        all.extend(items(&r.input, "input", &r.id)?);
        all.extend(output_items(r)?);
    }
    all.extend(items(&target.input, "input", &target.id)?);
    Ok(Some((target.clone(), all)))
}

/// Writes the whole conversation into every response continuing `id`, so that `id` can go.
fn detach_continuations(conn: &Connection, id: &str) -> Result<(), DbError> {
    let continuations: Vec<(String, String)> = conn
        .prepare_cached("SELECT id, input FROM responses WHERE previous_id = ?1")?
        .query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    if continuations.is_empty() {
        return Ok(());
    }
    let owner: String = conn.query_row("SELECT owner FROM responses WHERE id = ?1", params![id], |r| r.get(0))?;
    let Some((stored, mut before)) = conversation(conn, id, &owner)? else { return Ok(()) };
    before.extend(output_items(&stored)?);
    for (next, input) in continuations {
        let mut whole = before.clone();
        whole.extend(items(&input, "input", &next)?);
        conn.execute(
            "UPDATE responses SET input = ?1, previous_id = NULL WHERE id = ?2",
            params![Value::Array(whole).to_string(), next],
        )?;
    }
    Ok(())
}

impl Db {
    /// Stores a response, then forgets those created before `expire_before` (each after the
    /// responses continuing it, the new one included, took its conversation over). A response
    /// whose predecessor was deleted while it was generated is not stored (its chain would break).
    pub fn insert_response(&self, r: &StoredResponse, expire_before: u64) -> Result<(), DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if let Some(previous) = &r.previous_id {
            let exists: Option<i64> = tx
                .query_row("SELECT 1 FROM responses WHERE id = ?1 AND owner = ?2", params![previous, r.owner], |r| {
                    r.get(0)
                })
                .optional()?;
            if exists.is_none() {
                return Err(DbError::Corrupt(format!(
                    "response {} continues {previous}, which was deleted while it was generated",
                    r.id
                )));
            }
        }
        tx.execute(
            &format!("INSERT INTO responses ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
            params![r.id, r.owner, r.model, r.created_at as i64, r.input, r.response, r.previous_id],
        )
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
                DbError::Exists(format!("response {}", r.id))
            }
            e => DbError::Sqlite(e),
        })?;
        let expired: Vec<String> = tx
            .prepare("SELECT id FROM responses WHERE created_at < ?1 ORDER BY created_at, id")?
            .query_map(params![expire_before as i64], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for id in &expired {
            detach_continuations(&tx, id)?;
            tx.execute("DELETE FROM responses WHERE id = ?1", params![id])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The response `id` if `owner` made it, as stored.
    pub fn response(&self, id: &str, owner: &str) -> Result<Option<StoredResponse>, DbError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM responses WHERE id = ?1 AND owner = ?2"),
                params![id, owner],
                row,
            )
            .optional()?)
    }

    /// The response `id` if `owner` made it, with every input item it answered (earlier turns'
    /// included).
    pub fn response_conversation(
        &self,
        id: &str,
        owner: &str,
    ) -> Result<Option<(StoredResponse, Vec<Value>)>, DbError> {
        conversation(&self.conn(), id, owner)
    }

    pub fn delete_response(&self, id: &str, owner: &str) -> Result<bool, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mine: Option<String> = tx
            .query_row("SELECT id FROM responses WHERE id = ?1 AND owner = ?2", params![id, owner], |r| r.get(0))
            .optional()?;
        if mine.is_none() {
            return Ok(false);
        }
        detach_continuations(&tx, id)?;
        tx.execute("DELETE FROM responses WHERE id = ?1", params![id])?;
        tx.commit()?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(id: &str, created_at: u64, previous: Option<&str>, input: Value, answer: &str) -> StoredResponse {
        StoredResponse {
            id: id.into(),
            owner: "key-a".into(),
            model: "m".into(),
            created_at,
            input: input.to_string(),
            response: json!({"id": id, "output": [{"type": "message", "role": "assistant", "content": answer}]})
                .to_string(),
            previous_id: previous.map(str::to_owned),
        }
    }

    fn said(items: &[Value]) -> Vec<String> {
        items.iter().map(|i| i["content"].as_str().unwrap_or("?").to_owned()).collect()
    }

    fn user(text: &str) -> Value {
        json!([{"role": "user", "content": text}])
    }

    #[test]
    fn responses_are_seen_only_by_their_owner_and_expire() {
        let db = Db::open_in_memory().unwrap();
        let r = |id: &str, created_at| stored(id, created_at, None, json!([]), "");
        db.insert_response(&r("resp_1", 10), 0).unwrap();
        assert_eq!(db.response("resp_1", "key-a").unwrap(), Some(r("resp_1", 10)));
        assert_eq!(db.response("resp_1", "key-b").unwrap(), None);
        assert!(db.response_conversation("resp_1", "key-b").unwrap().is_none());
        assert!(!db.delete_response("resp_1", "key-b").unwrap());
        assert!(matches!(db.insert_response(&r("resp_1", 10), 0), Err(DbError::Exists(_))));
        // A later insert forgets what expired.
        db.insert_response(&r("resp_2", 50), 20).unwrap();
        assert_eq!(db.response("resp_1", "key-a").unwrap(), None);
        assert!(db.delete_response("resp_2", "key-a").unwrap());
        assert_eq!(db.response("resp_2", "key-a").unwrap(), None);
    }

    #[test]
    fn a_chain_stores_each_turn_once_and_reads_back_whole() {
        let db = Db::open_in_memory().unwrap();
        db.insert_response(&stored("r1", 1, None, user("q1"), "a1"), 0).unwrap();
        db.insert_response(&stored("r2", 2, Some("r1"), user("q2"), "a2"), 0).unwrap();
        db.insert_response(&stored("r3", 3, Some("r2"), user("q3"), "a3"), 0).unwrap();
        let (r3, items) = db.response_conversation("r3", "key-a").unwrap().unwrap();
        assert_eq!(said(&items), ["q1", "a1", "q2", "a2", "q3"]);
        assert_eq!(r3.input, user("q3").to_string(), "the row holds its own turn only");
        // Another key sees none of it, and cannot reach it through a chain either.
        assert!(db.response_conversation("r3", "key-b").unwrap().is_none());
    }

    #[test]
    fn deleting_or_expiring_an_earlier_turn_keeps_the_later_ones_whole() {
        let db = Db::open_in_memory().unwrap();
        db.insert_response(&stored("r1", 1, None, user("q1"), "a1"), 0).unwrap();
        db.insert_response(&stored("r2", 2, Some("r1"), user("q2"), "a2"), 0).unwrap();
        db.insert_response(&stored("r3", 3, Some("r2"), user("q3"), "a3"), 0).unwrap();
        db.insert_response(&stored("r3b", 4, Some("r2"), user("q3b"), "a3b"), 0).unwrap();
        assert!(db.delete_response("r2", "key-a").unwrap());
        for (id, want) in [("r3", "q3"), ("r3b", "q3b")] {
            let (row, items) = db.response_conversation(id, "key-a").unwrap().unwrap();
            assert_eq!(said(&items), ["q1", "a1", "q2", "a2", want], "{id}");
            assert_eq!(row.previous_id, None, "{id} now holds its whole conversation");
        }
        // Expiry walks oldest first: r1 and r2 of a new chain go, r3 keeps everything.
        let db = Db::open_in_memory().unwrap();
        db.insert_response(&stored("r1", 1, None, user("q1"), "a1"), 0).unwrap();
        db.insert_response(&stored("r2", 2, Some("r1"), user("q2"), "a2"), 0).unwrap();
        db.insert_response(&stored("r3", 30, Some("r2"), user("q3"), "a3"), 0).unwrap();
        db.insert_response(&stored("r4", 40, Some("r3"), user("q4"), "a4"), 10).unwrap();
        assert!(db.response("r1", "key-a").unwrap().is_none() && db.response("r2", "key-a").unwrap().is_none());
        let (_, items) = db.response_conversation("r4", "key-a").unwrap().unwrap();
        assert_eq!(said(&items), ["q1", "a1", "q2", "a2", "q3", "a3", "q4"]);
        // The response being stored continues one that expires as it is stored.
        db.insert_response(&stored("r5", 100, Some("r4"), user("q5"), "a5"), 50).unwrap();
        assert!(db.response("r4", "key-a").unwrap().is_none());
        let (r5, items) = db.response_conversation("r5", "key-a").unwrap().unwrap();
        assert_eq!(said(&items), ["q1", "a1", "q2", "a2", "q3", "a3", "q4", "a4", "q5"]);
        assert_eq!(r5.previous_id, None);
        // One whose predecessor was deleted while it was generated is refused, not left dangling.
        assert!(db.delete_response("r5", "key-a").unwrap());
        assert!(matches!(
            db.insert_response(&stored("r6", 101, Some("r5"), user("q6"), "a6"), 0),
            Err(DbError::Corrupt(m)) if m.contains("deleted while it was generated")
        ));
        assert!(db.response("r6", "key-a").unwrap().is_none());
    }

    #[test]
    fn rows_of_the_older_schema_read_as_whole_conversations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.db");
        {
            // A database as version 2 left it, with one stored response.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(super::super::MIGRATIONS[0]).unwrap();
            conn.execute_batch(super::super::MIGRATIONS[1]).unwrap();
            conn.pragma_update(None, "user_version", 2).unwrap();
            conn.execute(
                "INSERT INTO responses (id, owner, model, created_at, input, response) VALUES ('old', 'key-a', 'm', 1, ?1, '{}')",
                params![json!([{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]).to_string()],
            )
            .unwrap();
        }
        let db = Db::open(&path).unwrap();
        assert_eq!(db.schema_version(), super::super::MIGRATIONS.len(), "migrated to the latest");
        db.insert_response(&stored("new", 2, Some("old"), user("q3"), "a3"), 0).unwrap();
        let (_, items) = db.response_conversation("new", "key-a").unwrap().unwrap();
        assert_eq!(said(&items), ["q1", "a1", "q2", "q3"], "the old row had no output items");
    }
}
