//! The engine benchmarks nodes report in their heartbeats (spec 000: "kept with the model"),
//! one row per (model, node, engine): a new measurement replaces the old. Only registered
//! models are kept (a node's own models are not the router's to keep); deleting the model or
//! the node deletes its rows.

use super::{Db, DbError};
use llmr_cluster::EngineBenchmark;
use rusqlite::params;

/// A benchmark as the router keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredBenchmark {
    pub model: String,
    pub node_id: String,
    pub benchmark: EngineBenchmark,
}

impl Db {
    /// Keeps `benchmarks` of `model` measured by `node_id`, each replacing that engine's
    /// earlier row. A model that is not registered keeps nothing. Returns the rows written.
    pub fn record_benchmarks(
        &self,
        node_id: &str,
        model: &str,
        benchmarks: &[EngineBenchmark],
    ) -> Result<usize, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut written = 0;
        for b in benchmarks {
            tx.execute(
                "DELETE FROM model_benchmarks WHERE model_name = ?1 AND node_id = ?2 AND engine_id = ?3",
                params![model, node_id, b.engine_id],
            )?;
            written += tx.execute(
                "INSERT INTO model_benchmarks (model_name, node_id, engine_id, engine_version,
                    tokens_per_second, ttft_ms, peak_memory_bytes, measured_at)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8
                 WHERE EXISTS (SELECT 1 FROM models WHERE name = ?1) AND EXISTS (SELECT 1 FROM nodes WHERE id = ?2)",
                params![
                    model,
                    node_id,
                    b.engine_id,
                    b.engine_version,
                    b.tokens_per_second,
                    b.ttft_ms,
                    b.peak_memory_bytes as i64,
                    b.measured_at as i64
                ],
            )?;
        }
        tx.commit()?;
        Ok(written)
    }

    /// Every kept benchmark, by model, node and engine.
    pub fn benchmarks(&self) -> Result<Vec<StoredBenchmark>, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT model_name, node_id, engine_id, engine_version, tokens_per_second, ttft_ms, peak_memory_bytes,
                measured_at
             FROM model_benchmarks ORDER BY model_name, node_id, engine_id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(StoredBenchmark {
                model: r.get(0)?,
                node_id: r.get(1)?,
                benchmark: EngineBenchmark {
                    engine_id: r.get(2)?,
                    engine_version: r.get(3)?,
                    tokens_per_second: r.get(4)?,
                    ttft_ms: r.get(5)?,
                    peak_memory_bytes: r.get::<_, i64>(6)? as u64,
                    measured_at: r.get::<_, i64>(7)? as u64,
                },
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::tests::manifest;

    fn bench(engine: &str, tps: f64) -> EngineBenchmark {
        EngineBenchmark {
            engine_id: engine.into(),
            engine_version: "1.0.0".into(),
            tokens_per_second: tps,
            ttft_ms: 12.5,
            peak_memory_bytes: 3 << 30,
            measured_at: 1_700_000_000,
        }
    }

    #[test]
    fn benchmarks_are_kept_per_model_node_and_engine_and_go_with_the_model_or_node() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.db");
        let db = Db::open(&path).unwrap();
        db.insert_model(&manifest("m")).unwrap();
        let node = db.upsert_node("n1", "http://127.0.0.1:1", "{}", 0, "node-1").unwrap();
        assert_eq!(db.record_benchmarks(&node.id, "m", &[bench("a", 10.0), bench("b", 20.0)]).unwrap(), 2);
        // A new measurement replaces the engine's row; an unregistered model or unknown node keeps nothing.
        db.record_benchmarks(&node.id, "m", &[bench("a", 15.0)]).unwrap();
        assert_eq!(db.record_benchmarks(&node.id, "local-only", &[bench("a", 1.0)]).unwrap(), 0);
        assert_eq!(db.record_benchmarks("node-x", "m", &[bench("a", 1.0)]).unwrap(), 0);
        drop(db);
        let db = Db::open(&path).unwrap();
        let kept = db.benchmarks().unwrap();
        assert_eq!(
            kept.iter()
                .map(|b| (b.model.as_str(), b.benchmark.engine_id.as_str(), b.benchmark.tokens_per_second))
                .collect::<Vec<_>>(),
            [("m", "a", 15.0), ("m", "b", 20.0)]
        );
        assert_eq!(kept[0].benchmark, bench("a", 15.0));
        db.delete_node(&node.id).unwrap();
        assert!(db.benchmarks().unwrap().is_empty());
        let node = db.upsert_node("n1", "http://127.0.0.1:1", "{}", 0, "node-2").unwrap();
        db.record_benchmarks(&node.id, "m", &[bench("a", 1.0)]).unwrap();
        db.delete_model("m").unwrap();
        assert!(db.benchmarks().unwrap().is_empty());
    }
}
