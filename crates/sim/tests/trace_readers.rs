//! Trace readers: the kvtier schema round-trips, the Mooncake and Bailian
//! readers read small inline samples right, format detection, and malformed
//! lines are rejected with their line number.

use std::io::Write;
use std::path::Path;

use kvtier_core::BlockHash;
use kvtier_sim::trace::{self, Request, TraceError, TraceFormat};
use proptest::prelude::*;

fn file_with(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.flush().unwrap();
    f
}

#[test]
fn format_names_parse() {
    for f in TraceFormat::ALL {
        assert_eq!(f.name().parse::<TraceFormat>().unwrap(), f);
    }
    assert!(matches!(
        "csv".parse::<TraceFormat>(),
        Err(TraceError::UnknownFormat(_))
    ));
}

#[test]
fn mooncake_sample() {
    let f = file_with(
        "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [0, 1, 2]}\n\
         \n\
         {\"timestamp\": 27, \"input_length\": 1024, \"output_length\": 7, \"hash_ids\": [0, 1]}\n",
    );
    let mut reader = trace::open(f.path(), None).unwrap();
    assert_eq!(reader.format(), TraceFormat::Mooncake);
    let a = reader.next().unwrap().unwrap();
    assert_eq!(a.timestamp_ms, 0);
    assert_eq!(a.keys, vec![BlockHash(0), BlockHash(1), BlockHash(2)]);
    assert_eq!(
        (a.tokens_per_block, a.last_block_tokens),
        (512, 1100 - 1024)
    );
    assert_eq!((a.input_tokens, a.output_tokens, a.instance), (1100, 5, 0));
    let b = reader.next().unwrap().unwrap();
    assert_eq!((b.timestamp_ms, b.last_block_tokens), (27, 512));
    assert!(reader.next().is_none());
}

#[test]
fn bailian_chains_per_block_ids_into_prefix_keys() {
    let f = file_with(concat!(
        r#"{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 3, "type": "text", "turn": 1, "hash_ids": [7, 8, 9]}"#,
        "\n",
        r#"{"chat_id": 2, "parent_chat_id": 1, "timestamp": 1.25, "input_length": 48, "output_length": 3, "type": "text", "turn": 2, "hash_ids": [7, 8, 9]}"#,
        "\n",
        r#"{"chat_id": 3, "parent_chat_id": -1, "timestamp": 2.0, "input_length": 48, "output_length": 3, "type": "image", "turn": 1, "hash_ids": [7, 5, 9]}"#,
        "\n",
    ));
    let reqs = trace::read_all(f.path(), None).unwrap();
    assert_eq!(
        trace::open(f.path(), None).unwrap().format(),
        TraceFormat::Bailian
    );
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0].timestamp_ms, 500);
    assert_eq!(reqs[1].timestamp_ms, 1250);
    assert_eq!(
        (reqs[0].tokens_per_block, reqs[0].last_block_tokens),
        (16, 8)
    );
    // Equal prefixes give equal keys.
    assert_eq!(reqs[0].keys, reqs[1].keys);
    // Divergence at block 1: block 0 equal, blocks 1 and 2 differ, even
    // though block 2's per-block id (9) is the same.
    assert_eq!(reqs[2].keys[0], reqs[0].keys[0]);
    assert_ne!(reqs[2].keys[1], reqs[0].keys[1]);
    assert_ne!(reqs[2].keys[2], reqs[0].keys[2]);
    // Keys are chained, not the raw ids.
    assert_ne!(reqs[0].keys[2], BlockHash(9));
    // Types are interned as instances.
    assert_eq!((reqs[0].instance, reqs[1].instance), (0, 0));
    assert_eq!(reqs[2].instance, 1);
}

#[test]
fn malformed_lines_name_their_line() {
    let f = file_with(
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [0]}\n\
         \n\
         {\"timestamp\": 1, \"input_length\": \"ten\", \"hash_ids\": [0]}\n",
    );
    let err = trace::read_all(f.path(), None).unwrap_err();
    assert!(matches!(err, TraceError::Parse { line: 3, .. }), "{err}");
    assert!(err.to_string().starts_with("line 3:"), "{err}");

    let f = file_with("{\"timestamp\": 0, \"hash_ids\": [0]}\nnot json\n");
    let err = trace::read_all(f.path(), Some(TraceFormat::Mooncake)).unwrap_err();
    assert!(matches!(err, TraceError::Parse { line: 1, .. }), "{err}");

    let f = file_with(
        "{\"timestamp_ms\": 1, \"input_tokens\": 4, \"tokens_per_block\": 4, \"keys\": [\"zz\"]}\n",
    );
    let err = trace::read_all(f.path(), None).unwrap_err();
    assert!(matches!(err, TraceError::Parse { line: 1, .. }), "{err}");

    let f = file_with("\n{\"what\": 1}\n");
    assert!(matches!(
        trace::open(f.path(), None).unwrap_err(),
        TraceError::Detect { .. }
    ));

    let missing = Path::new("/nonexistent/kvtier/trace.jsonl");
    assert!(matches!(
        trace::open(missing, None).unwrap_err(),
        TraceError::Io { .. }
    ));
}

#[test]
fn empty_trace_reads_nothing() {
    let f = file_with("\n\n");
    assert!(trace::read_all(f.path(), None).unwrap().is_empty());
}

#[test]
fn kvtier_instance_names_are_interned() {
    let f = file_with(concat!(
        r#"{"timestamp_ms": 1, "instance": "llama", "input_tokens": 4, "tokens_per_block": 4, "keys": ["01"]}"#,
        "\n",
        r#"{"timestamp_ms": 2, "instance": "qwen", "input_tokens": 4, "tokens_per_block": 4, "keys": ["01"]}"#,
        "\n",
        r#"{"timestamp_ms": 3, "instance": "llama", "input_tokens": 4, "tokens_per_block": 4, "keys": ["01"]}"#,
        "\n",
    ));
    let reqs = trace::read_all(f.path(), None).unwrap();
    assert_eq!(reqs[0].instance, reqs[2].instance);
    assert_ne!(reqs[0].instance, reqs[1].instance);
    assert_eq!(reqs[0].keys, vec![BlockHash(1)]);
}

fn arb_request() -> impl Strategy<Value = Request> {
    (
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(any::<u128>(), 0..6),
        1u32..600,
    )
        .prop_flat_map(|(t, inst, input, output, keys, tpb)| {
            (Just((t, inst, input, output, keys)), Just(tpb), 1..=tpb)
        })
        .prop_map(|((t, inst, input, output, keys), tpb, last)| Request {
            timestamp_ms: t,
            instance: inst,
            input_tokens: input,
            output_tokens: output,
            keys: keys.into_iter().map(BlockHash).collect(),
            tokens_per_block: tpb,
            last_block_tokens: last,
        })
}

proptest! {
    #[test]
    fn kvtier_schema_round_trips(reqs in prop::collection::vec(arb_request(), 0..12)) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        trace::write_kvtier(&mut f, &reqs).unwrap();
        f.flush().unwrap();
        let back = trace::read_all(f.path(), if reqs.is_empty() { Some(TraceFormat::Kvtier) } else { None }).unwrap();
        prop_assert_eq!(back, reqs);
    }
}
