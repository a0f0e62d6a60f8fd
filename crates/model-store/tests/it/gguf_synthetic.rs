//! The GGUF reader against files written by the test writer: every value type, lazy arrays, and
//! damage of every kind, which must give a precise error and never a panic.

use crate::support::{s, small_model, strings, GgufWriter, Val};
use llmr_model_store::gguf::{GgufError, GgufErrorKind, GgufHeader, GgufType, GgufValue, Item, INLINE_ARRAY_MAX};
use std::io::Cursor;

fn read(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    GgufHeader::read_from(Cursor::new(bytes))
}

/// Offset of the first occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> u64 {
    hay.windows(needle.len()).position(|w| w == needle).expect("needle not in file") as u64
}

#[test]
fn every_value_type_round_trips() {
    let bytes = GgufWriter::new()
        .kv("u8", Val::U8(200))
        .kv("i8", Val::I8(-5))
        .kv("u16", Val::U16(65_000))
        .kv("i16", Val::I16(-30_000))
        .kv("u32", Val::U32(4_000_000_000))
        .kv("i32", Val::I32(-2_000_000_000))
        .kv("u64", Val::U64(u64::MAX))
        .kv("i64", Val::I64(i64::MIN))
        .kv("f32", Val::F32(0.5))
        .kv("f64", Val::F64(-1.25))
        .kv("bool", Val::Bool(true))
        .kv("string", s("héllo"))
        .kv("empty", Val::Arr(4, vec![]))
        .kv("ints", Val::Arr(5, vec![Val::I32(1), Val::I32(-2)]))
        .kv("nested", Val::Arr(9, vec![Val::Arr(4, vec![Val::U32(1)]), Val::Arr(8, vec![s("a"), s("b")])]))
        .build();
    let h = read(&bytes).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.tensor_count, 0);
    let get = |k: &str| h.get(k).unwrap_or_else(|| panic!("{k} missing"));
    assert_eq!(get("u8"), &GgufValue::U8(200));
    assert_eq!(get("i8"), &GgufValue::I8(-5));
    assert_eq!(get("u16"), &GgufValue::U16(65_000));
    assert_eq!(get("i16"), &GgufValue::I16(-30_000));
    assert_eq!(get("u32").as_u64(), Some(4_000_000_000));
    assert_eq!(get("i32").as_i64(), Some(-2_000_000_000));
    assert_eq!(get("u64"), &GgufValue::U64(u64::MAX));
    assert_eq!(get("i64").as_i64(), Some(i64::MIN));
    assert_eq!(get("f32").as_f64(), Some(0.5));
    assert_eq!(get("f64").as_f64(), Some(-1.25));
    assert_eq!(get("bool").as_bool(), Some(true));
    assert_eq!(get("string").as_str(), Some("héllo"));
    assert_eq!(get("empty").as_array().unwrap().values(), Some(&[][..]));
    let ints = get("ints").as_array().unwrap();
    assert_eq!((ints.elem_type, ints.len), (GgufType::I32, 2));
    assert_eq!(ints.values().unwrap(), &[GgufValue::I32(1), GgufValue::I32(-2)]);
    let nested = get("nested").as_array().unwrap().values().unwrap();
    assert_eq!(nested[0].as_array().unwrap().values().unwrap(), &[GgufValue::U32(1)]);
    assert_eq!(nested[1].as_array().unwrap().values().unwrap()[1].as_str(), Some("b"));
}

#[test]
fn version_2_is_read_too() {
    let mut w = small_model("llama", 2, 8);
    w.version = 2;
    assert_eq!(read(&w.build()).unwrap().version, 2);
}

#[test]
fn typed_accessors_read_the_well_known_keys() {
    let h = read(&small_model("llama", 15, 8).build()).unwrap();
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.name(), Some("Tiny Test"));
    assert_eq!(h.context_length(), Some(4096));
    assert_eq!(h.embedding_length(), Some(64));
    assert_eq!(h.block_count(), Some(2));
    assert_eq!(h.file_type(), Some(15));
    assert_eq!(h.quantization(), Some("Q4_K_M"));
    assert_eq!(h.chat_template(), Some("{% for m in messages %}{{ m.content }}{% endfor %}"));
    assert_eq!((h.bos_token_id(), h.bos_token()), (Some(1), Some("tok1")));
    assert_eq!((h.eos_token_id(), h.eos_token()), (Some(7), Some("tok7")));
    assert_eq!(h.pooling_type(), None);
    assert_eq!(h.tensor_count, 2);
    assert_eq!(h.data_offset % 32, 0);
}

#[test]
fn long_arrays_stay_on_disk_and_their_elements_are_read_on_demand() {
    let vocab = INLINE_ARRAY_MAX as usize * 3;
    let w = small_model("llama", 1, vocab).kv("scores", Val::Arr(6, (0..vocab).map(|i| Val::F32(i as f32)).collect()));
    let bytes = w.build();
    let h = read(&bytes).unwrap();
    let tokens = h.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert!(!tokens.is_loaded());
    assert_eq!((tokens.elem_type, tokens.len), (GgufType::String, vocab as u64));
    assert_eq!(h.eos_token(), Some(format!("tok{}", vocab - 1).as_str()));

    let element = |key: &str, i| h.get(key).unwrap().as_array().unwrap().read_element(Cursor::new(&bytes), i).unwrap();
    assert_eq!(element("tokenizer.ggml.tokens", 1234), Some(GgufValue::String("tok1234".into())));
    assert_eq!(element("scores", 2000), Some(GgufValue::F32(2000.0)));
    assert_eq!(element("scores", vocab as u64), None);
}

#[test]
fn long_arrays_of_arrays_are_skipped_and_readable() {
    let inner = |i: u32| Val::Arr(4, vec![Val::U32(i), Val::U32(i + 1)]);
    let n = INLINE_ARRAY_MAX as u32 + 10;
    let bytes = GgufWriter::new().kv("pairs", Val::Arr(9, (0..n).map(inner).collect())).kv("after", s("x")).build();
    let h = read(&bytes).unwrap();
    assert_eq!(h.get("after").unwrap().as_str(), Some("x"));
    let pairs = h.get("pairs").unwrap().as_array().unwrap();
    let GgufValue::Array(pair) = pairs.read_element(Cursor::new(&bytes), 1030).unwrap().unwrap() else { panic!() };
    assert_eq!(pair.values().unwrap(), &[GgufValue::U32(1030), GgufValue::U32(1031)]);
}

#[test]
fn every_prefix_of_a_valid_file_is_an_error() {
    let bytes = small_model("llama", 2, 8).kv("nested", Val::Arr(9, vec![Val::Arr(7, vec![Val::Bool(true)])])).build();
    read(&bytes).expect("the whole file is valid");
    for cut in 0..bytes.len() {
        let err = read(&bytes[..cut]).expect_err(&format!("prefix of {cut} bytes was accepted"));
        let expected = if cut < 4 { GgufErrorKind::NotGguf } else { GgufErrorKind::Corrupt };
        assert_eq!(err.kind(), expected, "cut at {cut}: {err}");
        if let GgufError::Truncated { offset, file_len, .. } = err {
            assert!(offset <= cut as u64 && file_len == cut as u64, "cut at {cut}: {err}");
        }
    }
}

#[test]
fn cuts_in_a_long_vocabulary_are_errors() {
    let bytes = small_model("llama", 2, 5000).build();
    for cut in (4..bytes.len()).step_by(97) {
        let err = read(&bytes[..cut]).expect_err(&format!("prefix of {cut} bytes was accepted"));
        assert!(err.is_corrupt(), "cut at {cut}: {err}");
    }
}

#[test]
fn flipped_bytes_never_panic() {
    let bytes = small_model("llama", 2, 8).build();
    for i in 0..bytes.len() {
        for flip in [0xff, 0x80, 0x01] {
            let mut damaged = bytes.clone();
            damaged[i] ^= flip;
            let _ = read(&damaged);
        }
    }
}

#[test]
fn bad_magic_is_not_a_gguf_file() {
    let mut bytes = small_model("llama", 2, 8).build();
    bytes[..4].copy_from_slice(b"GGML");
    let err = read(&bytes).unwrap_err();
    assert_eq!(err.kind(), GgufErrorKind::NotGguf);
    assert_eq!(err.to_string(), "not a GGUF file: it starts with [71, 71, 77, 76], expected \"GGUF\"");
    assert!(matches!(read(b"").unwrap_err(), GgufError::NotGguf { found } if found.is_empty()));
    assert!(matches!(read(b"{\"config\": 1}").unwrap_err(), GgufError::NotGguf { .. }));
}

#[test]
fn other_versions_and_byte_orders_are_unsupported() {
    for version in [1, 4, 0xdead] {
        let mut w = small_model("llama", 2, 8);
        w.version = version;
        assert!(matches!(read(&w.build()).unwrap_err(), GgufError::UnsupportedVersion { version: v } if v == version));
    }
    let mut w = small_model("llama", 2, 8);
    w.version = 3u32.swap_bytes();
    let err = read(&w.build()).unwrap_err();
    assert!(matches!(err, GgufError::BigEndian { version: 3 }), "{err}");
    assert_eq!(err.kind(), GgufErrorKind::Unsupported);
}

#[test]
fn absurd_lengths_are_refused_before_allocating() {
    // A key length of 2^63.
    let mut bytes = GgufWriter::new().kv("k", Val::U8(1)).build();
    bytes[24..32].copy_from_slice(&(1u64 << 63).to_le_bytes());
    match read(&bytes).unwrap_err() {
        GgufError::TooLarge { item: Item::Key { index: 0 }, offset: 24, value, .. } => assert_eq!(value, 1 << 63),
        other => panic!("{other}"),
    }

    // A string value claiming 1 TiB.
    let mut payload = (1u64 << 40).to_le_bytes().to_vec();
    payload.extend(b"abc");
    let bytes = GgufWriter::new().kv("general.name", Val::Raw(8, payload)).build();
    let err = read(&bytes).unwrap_err();
    let at = find(&bytes, b"general.name") + 12 + 4;
    // The limit is what is left of the file after the length field.
    let left = bytes.len() as u64 - at - 8;
    assert!(matches!(&err, GgufError::TooLarge { offset, value, .. } if *offset == at && *value == 1 << 40), "{err}");
    assert_eq!(
        err.to_string(),
        format!("corrupt GGUF: value of 'general.name' at byte {at}: 1099511627776 exceeds the limit of {left}")
    );

    // An array claiming u64::MAX elements.
    let mut payload = 4u32.to_le_bytes().to_vec();
    payload.extend(u64::MAX.to_le_bytes());
    let bytes = GgufWriter::new().kv("arr", Val::Raw(9, payload)).build();
    assert!(matches!(read(&bytes).unwrap_err(), GgufError::TooLarge { value: u64::MAX, .. }));
}

#[test]
fn absurd_counts_are_refused() {
    let mut bytes = small_model("llama", 2, 8).build();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(read(&bytes).unwrap_err(), GgufError::TooLarge { item: Item::TensorCount, offset: 8, .. }));
    let mut bytes = small_model("llama", 2, 8).build();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(read(&bytes).unwrap_err(), GgufError::TooLarge { item: Item::MetadataCount, offset: 16, .. }));
}

#[test]
fn unknown_value_type_names_key_and_offset() {
    let bytes = GgufWriter::new().kv("a", Val::U8(1)).kv("weird", Val::Raw(13, vec![0; 8])).build();
    let at = find(&bytes, b"weird") + 5;
    match read(&bytes).unwrap_err() {
        GgufError::UnknownValueType { item: Item::Value { key }, offset, type_id: 13 } => {
            assert_eq!((key.as_str(), offset), ("weird", at));
        }
        other => panic!("{other}"),
    }
    // Inside an array too.
    let mut payload = 99u32.to_le_bytes().to_vec();
    payload.extend(1u64.to_le_bytes());
    let bytes = GgufWriter::new().kv("arr", Val::Raw(9, payload)).build();
    assert!(matches!(read(&bytes).unwrap_err(), GgufError::UnknownValueType { type_id: 99, .. }));
}

#[test]
fn nesting_is_bounded() {
    let mut value = Val::Arr(4, vec![Val::U32(7)]);
    for _ in 0..7 {
        value = Val::Arr(9, vec![value]);
    }
    read(&GgufWriter::new().kv("deep", value.clone()).build()).expect("8 levels are allowed");
    let too_deep = Val::Arr(9, vec![value]);
    let err = read(&GgufWriter::new().kv("deep", too_deep).build()).unwrap_err();
    assert!(matches!(err, GgufError::TooDeep { limit: 8, .. }), "{err}");
}

#[test]
fn invalid_scalars_are_corrupt() {
    let err = read(&GgufWriter::new().kv("flag", Val::Raw(7, vec![2])).build()).unwrap_err();
    assert!(matches!(err, GgufError::InvalidBool { byte: 2, .. }), "{err}");
    let mut payload = 2u64.to_le_bytes().to_vec();
    payload.extend([0xff, 0xfe]);
    let err = read(&GgufWriter::new().kv("name", Val::Raw(8, payload)).build()).unwrap_err();
    assert!(matches!(err, GgufError::InvalidUtf8 { .. }), "{err}");
    let err = read(&GgufWriter::new().kv("k", Val::U8(1)).kv("k", Val::U8(2)).build()).unwrap_err();
    assert!(matches!(&err, GgufError::DuplicateKey { key, .. } if key == "k"), "{err}");
}

#[test]
fn tensor_descriptions_are_checked() {
    let err = read(&small_model("llama", 2, 8).kv("general.alignment", Val::U32(48)).build()).unwrap_err();
    assert!(matches!(err, GgufError::BadAlignment { .. }), "{err}");
    let err = read(&small_model("llama", 2, 8).kv("general.alignment", s("32")).build()).unwrap_err();
    assert!(matches!(err, GgufError::BadAlignment { .. }), "{err}");

    // Five dimensions.
    let mut bytes = GgufWriter::new().tensor("t", &[32], 0).build();
    let dims_at = find(&bytes, b"t") as usize + 1;
    bytes[dims_at..dims_at + 4].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(read(&bytes).unwrap_err(), GgufError::BadDimensions { n_dims: 5, .. }));

    // A quantized row that does not fill its blocks.
    let mut bytes = GgufWriter::new().tensor("t", &[64], 2).build();
    let dim_at = find(&bytes, b"t") as usize + 5;
    bytes[dim_at..dim_at + 8].copy_from_slice(&40u64.to_le_bytes());
    assert!(read(&bytes).unwrap_err().to_string().contains("not a multiple of the block size 32"));

    // Data cut short after intact tensor infos.
    let bytes = small_model("llama", 2, 8).build();
    let err = read(&bytes[..bytes.len() - 1]).unwrap_err();
    assert!(matches!(err, GgufError::DataTruncated { .. }), "{err}");
}

#[test]
fn strings_arrays_of_strings_use_the_helper() {
    // The support writer's helper builds string arrays of any length.
    let bytes = GgufWriter::new().kv("l", strings(["a".to_string()])).build();
    assert_eq!(read(&bytes).unwrap().get("l").unwrap().as_array().unwrap().len, 1);
}

#[test]
fn memory_for_loaded_arrays_is_bounded_per_file() {
    // 100 short arrays: 100,000 elements in all, past the loading budget of 65,536.
    let mut w = GgufWriter::new();
    for i in 0..100 {
        w = w.kv(&format!("a{i:03}"), Val::Arr(0, vec![Val::U8(i); 1000]));
    }
    let bytes = w.build();
    let h = read(&bytes).unwrap();
    let array = |k: &str| h.get(k).unwrap().as_array().unwrap().clone();
    assert!(array("a000").is_loaded());
    assert!(!array("a099").is_loaded());
    assert_eq!(array("a099").read_element(Cursor::new(&bytes), 999).unwrap(), Some(GgufValue::U8(99)));
}
