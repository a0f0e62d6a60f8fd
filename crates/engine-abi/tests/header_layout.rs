//! Fails when `include/llmr_engine.h` and the Rust mirror disagree.
//!
//! One table below names every struct, field and constant of the ABI. From it the test writes a C
//! program that prints sizeof / offsetof / the value of each as the C compiler sees them through the
//! header, compiles it with the system compiler (`cc`, or `$CC`), runs it, and compares every line
//! with what Rust computes for the same names.

use llmr_engine_abi::*;
use std::mem::{offset_of, size_of};
use std::process::Command;

/// (C expression, value Rust computes for it)
type Row = (String, u64);

macro_rules! layout {
    ($rows:ident, $ty:ident { $($field:ident),* $(,)? }) => {
        $rows.push((format!("sizeof({})", stringify!($ty)), size_of::<$ty>() as u64));
        $(
            $rows.push((
                format!("offsetof({}, {})", stringify!($ty), stringify!($field)),
                offset_of!($ty, $field) as u64,
            ));
        )*
    };
}

macro_rules! constants {
    ($rows:ident, $($name:ident),* $(,)?) => {
        $( $rows.push((format!("(long long)({})", stringify!($name)), $name as i64 as u64)); )*
    };
}

fn rows() -> Vec<Row> {
    let mut r: Vec<Row> = Vec::new();
    layout!(r, llmr_str { ptr, len });
    layout!(r, llmr_tokens { ids, count });
    layout!(r, llmr_engine_info { struct_size, abi_major, abi_minor, capabilities, engine_id, version });
    layout!(
        r,
        llmr_engine_config {
            struct_size,
            gpu_backend,
            device_id,
            slots,
            vram_limit_bytes,
            context_length,
            threads,
            log_fn,
            log_user_data,
            device_name,
            device_memory_total_bytes,
            device_memory_free_bytes,
            host_memory_total_bytes,
            params_json,
        }
    );
    layout!(
        r,
        llmr_model_desc {
            struct_size,
            format,
            model_id,
            model_dir,
            primary_file,
            architecture,
            quantization,
            mmproj_file,
            context_length,
            options_json,
        }
    );
    layout!(
        r,
        llmr_infer_request {
            struct_size,
            flags,
            request_id,
            model_id,
            prompt,
            max_tokens,
            top_k,
            temperature,
            top_p,
            min_p,
            repeat_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
            stop,
            stop_count,
            top_logprobs,
            constraint,
            prompt_tokens,
            constraint_kind,
        }
    );
    layout!(r, llmr_top_logprob { token_id, logprob, text });
    layout!(r, llmr_token { struct_size, token_id, text, logprob, top_count, top, timestamp_ns });
    layout!(
        r,
        llmr_infer_result {
            struct_size,
            finish_reason,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            stop_index,
            prompt_eval_ns,
            generation_ns,
        }
    );
    layout!(r, llmr_embed_request { struct_size, flags, request_id, model_id, inputs, input_count, token_inputs });
    layout!(r, llmr_embed_result { struct_size, prompt_tokens });
    layout!(
        r,
        llmr_transcribe_request {
            struct_size,
            sample_rate,
            request_id,
            model_id,
            samples,
            sample_count,
            language,
            prompt,
            temperature,
            padding_1_0,
            flags,
            beam_size,
            reserved,
        }
    );
    layout!(r, llmr_word { struct_size, probability, start_ms, end_ms, text });
    layout!(
        r,
        llmr_segment {
            struct_size,
            reserved,
            start_ms,
            end_ms,
            text,
            words,
            word_count,
            tokens,
            token_count,
            language,
            avg_logprob,
            no_speech_prob,
            temperature,
            reserved2,
        }
    );
    layout!(r, llmr_synthesize_request { struct_size, reserved, request_id, model_id, text, voice, speed });
    layout!(
        r,
        llmr_image_request {
            struct_size,
            width,
            height,
            steps,
            request_id,
            model_id,
            prompt,
            negative_prompt,
            guidance_scale,
            count,
            seed,
            seed_set,
        }
    );
    constants!(
        r,
        LLMR_ENGINE_ABI_MAJOR,
        LLMR_ENGINE_ABI_MINOR,
        LLMR_OK,
        LLMR_ERR_OOM_VRAM,
        LLMR_ERR_OOM_RAM,
        LLMR_ERR_MODEL_CORRUPT,
        LLMR_ERR_TIMEOUT,
        LLMR_ERR_CANCELLED,
        LLMR_ERR_UNSUPPORTED,
        LLMR_ERR_INTERNAL,
        LLMR_ERR_ABI_MISMATCH,
        LLMR_ERR_LOAD_FAILED,
        LLMR_GPU_METAL,
        LLMR_GPU_DIRECTML,
        LLMR_GPU_CUDA,
        LLMR_GPU_CPU,
        LLMR_FORMAT_GGUF,
        LLMR_FORMAT_SAFETENSORS,
        LLMR_FORMAT_ONNX,
        LLMR_FORMAT_GGML,
        LLMR_FORMAT_UNKNOWN,
        LLMR_CAP_TEXT,
        LLMR_CAP_EMBEDDING,
        LLMR_CAP_VISION,
        LLMR_CAP_ASR,
        LLMR_CAP_TTS,
        LLMR_CAP_IMAGE,
        LLMR_CAP_CONSTRAINED,
        LLMR_CAP_TOKEN_INPUT,
        LLMR_CAP_SPECIAL_TEXT,
        LLMR_LOG_ERROR,
        LLMR_LOG_WARN,
        LLMR_LOG_INFO,
        LLMR_LOG_DEBUG,
        LLMR_LOG_TRACE,
        LLMR_FINISH_NONE,
        LLMR_FINISH_STOP,
        LLMR_FINISH_LENGTH,
        LLMR_FINISH_CANCELLED,
        LLMR_FINISH_ERROR,
        LLMR_CONSTRAINT_NONE,
        LLMR_CONSTRAINT_JSON_SCHEMA,
        LLMR_CONSTRAINT_REGEX,
        LLMR_CONSTRAINT_LARK,
        LLMR_INFER_SEED_SET,
        LLMR_INFER_LOGPROBS,
        LLMR_INFER_PARSE_SPECIAL,
        LLMR_INFER_ADD_BOS,
        LLMR_INFER_IGNORE_EOS,
        LLMR_INFER_NO_SPECULATION,
        LLMR_INFER_SPECIAL_TEXT,
        LLMR_EMBED_NORMALIZE,
        LLMR_TRANSCRIBE_TRANSLATE,
        LLMR_TRANSCRIBE_WORD_TIMESTAMPS,
    );
    r
}

/// The exported functions, assigned to the header's pointer typedefs: a prototype and typedef that
/// disagree fail to compile. The Rust side of the same check is the `let _: T = f` lines below.
const EXPORT_TYPEDEF_CHECK: &str = r#"
static void check_typedefs(void) {
    llmr_engine_get_info_fn a = llmr_engine_get_info; (void)a;
    llmr_engine_create_fn b = llmr_engine_create; (void)b;
    llmr_engine_destroy_fn c = llmr_engine_destroy; (void)c;
    llmr_engine_load_model_fn d = llmr_engine_load_model; (void)d;
    llmr_engine_unload_model_fn e = llmr_engine_unload_model; (void)e;
    llmr_engine_model_info_fn f = llmr_engine_model_info; (void)f;
    llmr_engine_tokenize_fn g = llmr_engine_tokenize; (void)g;
    llmr_engine_infer_fn h = llmr_engine_infer; (void)h;
    llmr_engine_embed_fn i = llmr_engine_embed; (void)i;
    llmr_engine_transcribe_fn j = llmr_engine_transcribe; (void)j;
    llmr_engine_synthesize_fn k = llmr_engine_synthesize; (void)k;
    llmr_engine_generate_image_fn l = llmr_engine_generate_image; (void)l;
    llmr_engine_cancel_fn m = llmr_engine_cancel; (void)m;
    llmr_engine_get_metrics_fn n = llmr_engine_get_metrics; (void)n;
    llmr_engine_set_config_fn o = llmr_engine_set_config; (void)o;
    llmr_engine_last_error_fn p = llmr_engine_last_error; (void)p;
}
"#;

/// Compiles `source` against the header; `extra` picks the mode (`-fsyntax-only`, `-o exe`).
fn compile_c(source: &std::path::Path, extra: &[&std::ffi::OsStr]) {
    let include = std::path::Path::new(HEADER_PATH).parent().unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function", "-I"])
        .arg(include)
        .arg(source)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        out.status.success(),
        "compiling {} against the header failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_prototypes_match_their_typedefs() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("typedefs.c");
    std::fs::write(&src, format!("#include \"llmr_engine.h\"\n{EXPORT_TYPEDEF_CHECK}")).unwrap();
    compile_c(&src, &["-fsyntax-only".as_ref()]);
}

#[test]
fn header_and_rust_mirror_agree() {
    let rows = rows();
    let dir = tempfile::tempdir().unwrap();
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"llmr_engine.h\"\n");
    c.push_str("int main(void) {\n");
    for (expr, _) in &rows {
        c.push_str(&format!("    printf(\"%llu\\n\", (unsigned long long)({expr}));\n"));
    }
    c.push_str("    return 0;\n}\n");
    let src = dir.path().join("layout.c");
    let exe = dir.path().join("layout");
    std::fs::write(&src, c).unwrap();
    compile_c(&src, &["-o".as_ref(), exe.as_os_str()]);
    let out = Command::new(&exe).output().unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    let c_values: Vec<u64> = printed.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(c_values.len(), rows.len());
    let mismatches: Vec<String> = rows
        .iter()
        .zip(&c_values)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C says {c}, Rust says {rust}"))
        .collect();
    assert!(mismatches.is_empty(), "header and Rust mirror disagree:\n{}", mismatches.join("\n"));
}

#[test]
fn rust_export_types_match_the_header_typedefs() {
    // The Rust mirror of each export typedef must accept a function of the documented shape.
    unsafe extern "C" fn cancel(_: *mut llmr_engine, _: u64) -> llmr_status {
        LLMR_OK
    }
    unsafe extern "C" fn last_error(_: *const llmr_engine) -> *const std::ffi::c_char {
        c"".as_ptr()
    }
    let _: llmr_engine_cancel_fn = cancel;
    let _: llmr_engine_last_error_fn = last_error;
    assert_eq!(symbols::GET_INFO.last(), Some(&0));
}
