/*
 * llmr_engine.h: the llmr engine plugin C ABI, major version 1.
 *
 * This header is the single source of truth for the contract between an llmr node (the "host")
 * and an inference engine plugin. A plugin is a shared library (.so / .dylib / .dll) with a
 * manifest.json beside it, found under engines/<engine_id>/<gpu_backend>/. The Rust crate
 * `llmr-engine-abi` mirrors this file; a test compiles this header and fails when the two disagree.
 *
 * ---------------------------------------------------------------------------------------------
 * VERSIONING AND COMPATIBILITY
 * - LLMR_ENGINE_ABI_MAJOR changes only when an existing type, field, function or meaning changes.
 *   The host loads a plugin only when the plugin's major version equals its own.
 * - LLMR_ENGINE_ABI_MINOR grows when something is ADDED: a new optional export (the host finds it
 *   with dlsym and does without it when absent), a new field appended at the END of a struct, a
 *   new enum value, a new flag bit. Old plugins keep working with newer hosts and the reverse.
 *   An appended field starts at or after the previous version's sizeof, never in its trailing
 *   padding: an older writer counts that padding in struct_size and leaves it uninitialised.
 *   A field named `reserved` may be given a meaning by a later minor version; its readers use it
 *   only from plugins reporting that minor version or later.
 * - Every struct that crosses the boundary begins with `uint32_t struct_size`, set by whoever
 *   fills the struct to sizeof() of the struct as it knows it. A reader uses a field only when
 *   the field lies entirely within struct_size; a field beyond it reads as zero / NULL. A writer
 *   that receives a struct to fill (a result) writes only the fields that lie within its
 *   struct_size. Readers ignore unknown flag bits and treat unknown enum values as documented
 *   below.
 * - Enumerations travel as uint32_t (never as C enums) so their size is fixed.
 *
 * ---------------------------------------------------------------------------------------------
 * OWNERSHIP AND LIFETIMES (the rules that apply unless a declaration says otherwise)
 * - Pointers the host passes INTO a call (configs, requests, strings, arrays) are borrowed: they
 *   are valid only until that call returns. A plugin that needs the data later copies it.
 * - Pointers the plugin passes to a HOST CALLBACK (token text, embeddings, audio, images, JSON)
 *   are borrowed by the host for the duration of the callback only. The host copies what it keeps.
 * - Nothing allocated on one side is ever freed on the other: there is no free() across the ABI.
 *   Variable-size output always travels through callbacks (the plugin lends, the host copies).
 * - llmr_engine_get_info returns a pointer to static storage owned by the plugin, valid until
 *   the library is unloaded.
 * - An llmr_engine handle is created by llmr_engine_create and owned by the host, which releases
 *   it exactly once with llmr_engine_destroy.
 * - The string returned by llmr_engine_last_error is owned by the plugin and valid until the next
 *   call made on the same handle by the same thread.
 * - Strings are UTF-8. A string given as (pointer, length) need not be NUL-terminated; a string
 *   given as a bare `const char *` is NUL-terminated. NULL is allowed only where documented.
 *
 * ---------------------------------------------------------------------------------------------
 * THREADING
 * - Every function taking an llmr_engine* may be called concurrently from any number of host
 *   threads, except llmr_engine_destroy, which the host calls only once every other call on that
 *   handle has returned. Plugins synchronise internally (continuous batching lives in the engine).
 * - Callbacks for one request may run on any thread, but never concurrently with each other, and
 *   never after the call that received them has returned.
 * - llmr_engine_infer and its siblings block until the request has finished, failed or been
 *   cancelled. The host runs them on threads it dedicates to blocking work.
 *
 * ---------------------------------------------------------------------------------------------
 * ERRORS
 * - Every function returns an llmr_status. On failure the plugin makes a human-readable message
 *   available through llmr_engine_last_error. Unknown status values are treated as
 *   LLMR_ERR_INTERNAL by the host.
 * - A plugin must never let an exception or a panic cross the boundary.
 * - Functions a plugin does not support are still exported and return LLMR_ERR_UNSUPPORTED.
 */
#ifndef LLMR_ENGINE_H
#define LLMR_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LLMR_ENGINE_ABI_MAJOR 1u
#define LLMR_ENGINE_ABI_MINOR 5u

#if defined(_WIN32)
#define LLMR_EXPORT __declspec(dllexport)
#else
#define LLMR_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes (spec 001). HTTP mapping, kept by the host in one place:                       */
/* OK 200, OOM_VRAM 507, OOM_RAM 507, MODEL_CORRUPT 500, TIMEOUT 504, CANCELLED 499,           */
/* UNSUPPORTED 501, INTERNAL 500, ABI_MISMATCH 500, LOAD_FAILED 500.                           */
/* ------------------------------------------------------------------------------------------ */
typedef int32_t llmr_status;
#define LLMR_OK 0
#define LLMR_ERR_OOM_VRAM 1      /* not enough device memory */
#define LLMR_ERR_OOM_RAM 2       /* not enough host memory */
#define LLMR_ERR_MODEL_CORRUPT 3 /* the model file is recognised but damaged or truncated */
#define LLMR_ERR_TIMEOUT 4       /* the engine gave up waiting */
#define LLMR_ERR_CANCELLED 5     /* cancelled by llmr_engine_cancel or a callback returning false */
#define LLMR_ERR_UNSUPPORTED 6   /* the engine lacks this capability */
#define LLMR_ERR_INTERNAL 7      /* a bug or an unexpected failure inside the engine */
#define LLMR_ERR_ABI_MISMATCH 8  /* a struct or version the engine cannot accept */
#define LLMR_ERR_LOAD_FAILED 9   /* the model could not be loaded (wrong format, missing file) */

/* GPU backends (spec 001 numbering). */
#define LLMR_GPU_METAL 0u
#define LLMR_GPU_DIRECTML 1u
#define LLMR_GPU_CUDA 2u
#define LLMR_GPU_CPU 255u

/* Model formats (spec 001 numbering, extended). */
#define LLMR_FORMAT_GGUF 0u
#define LLMR_FORMAT_SAFETENSORS 1u
#define LLMR_FORMAT_ONNX 2u
#define LLMR_FORMAT_GGML 3u
#define LLMR_FORMAT_UNKNOWN 255u

/* Capability bits, reported in llmr_engine_info.capabilities. */
#define LLMR_CAP_TEXT (1u << 0)
#define LLMR_CAP_EMBEDDING (1u << 1)
#define LLMR_CAP_VISION (1u << 2)
#define LLMR_CAP_ASR (1u << 3)
#define LLMR_CAP_TTS (1u << 4)
#define LLMR_CAP_IMAGE (1u << 5)
#define LLMR_CAP_CONSTRAINED (1u << 6) /* minor 1: honours llmr_infer_request.constraint_kind */
#define LLMR_CAP_TOKEN_INPUT (1u << 7) /* minor 1: reads prompt_tokens / token_inputs */
#define LLMR_CAP_SPECIAL_TEXT (1u << 8) /* minor 5: honours LLMR_INFER_SPECIAL_TEXT */

/* Log levels for llmr_log_fn. */
#define LLMR_LOG_ERROR 1u
#define LLMR_LOG_WARN 2u
#define LLMR_LOG_INFO 3u
#define LLMR_LOG_DEBUG 4u
#define LLMR_LOG_TRACE 5u

/* Why a generation ended (llmr_infer_result.finish_reason). Unknown values read as ERROR. */
#define LLMR_FINISH_NONE 0u      /* not finished (never in a returned result) */
#define LLMR_FINISH_STOP 1u      /* end-of-generation token or a stop sequence */
#define LLMR_FINISH_LENGTH 2u    /* max_tokens or the context length was reached */
#define LLMR_FINISH_CANCELLED 3u /* cancelled; infer returns LLMR_ERR_CANCELLED */
#define LLMR_FINISH_ERROR 4u     /* failed; infer returns the error status */

/* llmr_infer_request.flags */
#define LLMR_INFER_SEED_SET (1u << 0)       /* `seed` is meaningful; otherwise the engine picks */
#define LLMR_INFER_LOGPROBS (1u << 1)       /* fill llmr_token.logprob and top alternatives */
#define LLMR_INFER_PARSE_SPECIAL (1u << 2)  /* special-token text in the prompt becomes tokens */
#define LLMR_INFER_ADD_BOS (1u << 3)        /* prepend the model's BOS token when it has one */
#define LLMR_INFER_IGNORE_EOS (1u << 4)     /* keep generating past end-of-generation tokens */
#define LLMR_INFER_NO_SPECULATION (1u << 5) /* minor 4: decode one token per step, no drafts (an
                                               engine without speculation ignores it) */
#define LLMR_INFER_SPECIAL_TEXT (1u << 6)   /* minor 5: control tokens the model generates (not
                                               the end-of-generation ones) are written as their
                                               text (`<|channel|>`) instead of nothing, for a host
                                               that reads a format made of them (gpt-oss's
                                               harmony). Sent only to plugins reporting
                                               LLMR_CAP_SPECIAL_TEXT. */

/*
 * llmr_infer_request.constraint_kind (minor 1): the language the output must belong to. The
 * engine masks its logits at every step so that only tokens keeping the output inside it can be
 * chosen, and ends the generation (LLMR_FINISH_STOP) when the grammar allows nothing more. The
 * host sends a constraint only to plugins reporting LLMR_CAP_CONSTRAINED. A kind the plugin does
 * not know, or a constraint that does not compile, is LLMR_ERR_UNSUPPORTED with a message saying
 * what is wrong in it (the node answers 400 on the field the constraint came from).
 */
#define LLMR_CONSTRAINT_NONE 0u
#define LLMR_CONSTRAINT_JSON_SCHEMA 1u /* a JSON Schema document (its text) */
#define LLMR_CONSTRAINT_REGEX 2u       /* a regular expression the whole output matches */
#define LLMR_CONSTRAINT_LARK 3u        /* a Lark grammar, in llguidance's dialect */

/* llmr_transcribe_request.flags (minor 2) */
#define LLMR_TRANSCRIBE_TRANSLATE (1u << 0)       /* write the speech in English, whatever its language */
#define LLMR_TRANSCRIBE_WORD_TIMESTAMPS (1u << 1) /* fill llmr_segment.words */

/* llmr_embed_request.flags */
#define LLMR_EMBED_NORMALIZE (1u << 0) /* L2-normalise each vector */

/* ------------------------------------------------------------------------------------------ */
/* Basic types                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* A borrowed UTF-8 string: `len` bytes at `ptr`, not necessarily NUL-terminated. */
typedef struct llmr_str {
    const char *ptr;
    size_t len;
} llmr_str;

/* Borrowed token ids of the model's vocabulary (minor 1). */
typedef struct llmr_tokens {
    const int32_t *ids;
    size_t count;
} llmr_tokens;

/* An engine instance. Opaque: the host never looks inside. */
typedef struct llmr_engine llmr_engine;

/* Receives a block of UTF-8 bytes (JSON, a message). Borrowed for the duration of the call. */
typedef void (*llmr_write_fn)(void *user_data, const char *data, size_t len);

/*
 * Receives one log line from the engine. `message` is borrowed for the call. May be called from
 * any engine thread at any time between create and the return of destroy, concurrently.
 */
typedef void (*llmr_log_fn)(void *user_data, uint32_t level, const char *message, size_t len);

/* ------------------------------------------------------------------------------------------ */
/* Plugin identity                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Static description of the plugin. Owned by the plugin, valid until the library is unloaded. */
typedef struct llmr_engine_info {
    uint32_t struct_size;
    uint32_t abi_major;    /* must equal the host's LLMR_ENGINE_ABI_MAJOR */
    uint32_t abi_minor;    /* the minor version the plugin was built against */
    uint32_t capabilities; /* LLMR_CAP_* bits */
    const char *engine_id; /* e.g. "llama_cpp"; must equal the manifest's id */
    const char *version;   /* semver, e.g. "1.2.0"; must equal the manifest's version */
} llmr_engine_info;

/* ------------------------------------------------------------------------------------------ */
/* Engine instance                                                                            */
/* ------------------------------------------------------------------------------------------ */

typedef struct llmr_engine_config {
    uint32_t struct_size;
    uint32_t gpu_backend;       /* LLMR_GPU_* the instance must run on */
    int32_t device_id;          /* GPU ordinal; -1 = the engine's choice */
    uint32_t slots;             /* max concurrent sequences; 0 = the engine's default */
    uint64_t vram_limit_bytes;  /* device memory the instance may use; 0 = no limit */
    uint32_t context_length;    /* default context per sequence; 0 = the engine's default (normally
                                   the model's training context, possibly capped by the engine) */
    uint32_t threads;           /* CPU threads; 0 = the engine's default */
    llmr_log_fn log_fn;         /* may be NULL */
    void *log_user_data;        /* passed back to log_fn */
    const char *device_name;    /* host's view of the device, e.g. "NVIDIA H100"; may be NULL */
    uint64_t device_memory_total_bytes; /* 0 = unknown */
    uint64_t device_memory_free_bytes;  /* 0 = unknown */
    uint64_t host_memory_total_bytes;   /* 0 = unknown */
    const char *params_json;    /* the manifest's custom engine parameters as a JSON object, or NULL */
} llmr_engine_config;

/* ------------------------------------------------------------------------------------------ */
/* Models                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* What the node knows about a model it asks the engine to load (spec 001 ModelDescriptor). */
typedef struct llmr_model_desc {
    uint32_t struct_size;
    uint32_t format;             /* LLMR_FORMAT_* */
    const char *model_id;        /* the name later requests use; unique within the instance */
    const char *model_dir;       /* directory holding the model's files */
    const char *primary_file;    /* path of the main file (.gguf, .safetensors.index.json, ...) */
    const char *architecture;    /* from config.json / GGUF general.architecture; may be NULL */
    const char *quantization;    /* e.g. "Q4_K_M"; may be NULL */
    const char *mmproj_file;     /* vision projector path; may be NULL */
    uint32_t context_length;     /* context per sequence for this model; 0 = instance default */
    const char *options_json;    /* engine-specific load options as a JSON object, or NULL */
} llmr_model_desc;

/* ------------------------------------------------------------------------------------------ */
/* Text generation                                                                            */
/* ------------------------------------------------------------------------------------------ */

typedef struct llmr_infer_request {
    uint32_t struct_size;
    uint32_t flags;              /* LLMR_INFER_* */
    uint64_t request_id;         /* host-chosen, unique among running requests; see cancel */
    const char *model_id;        /* a model loaded on this instance */
    llmr_str prompt;             /* the fully rendered prompt (chat templates are applied by the host) */
    uint32_t max_tokens;         /* 0 = until the context is full */
    uint32_t top_k;              /* 0 = disabled */
    float temperature;           /* 0 = greedy */
    float top_p;                 /* 1 = disabled */
    float min_p;                 /* 0 = disabled */
    float repeat_penalty;        /* 1 = disabled */
    float presence_penalty;      /* 0 = disabled */
    float frequency_penalty;     /* 0 = disabled */
    uint64_t seed;               /* used when LLMR_INFER_SEED_SET */
    const llmr_str *stop;        /* stop sequences; the matched text is not emitted */
    size_t stop_count;
    uint32_t top_logprobs;       /* alternatives per token when LLMR_INFER_LOGPROBS, 0..20 */
    /* Minor 1 (starting at the 1.0 size: see VERSIONING). */
    llmr_str constraint;         /* the constraint's text; empty when NONE */
    llmr_tokens prompt_tokens;   /* count > 0: the prompt as token ids, used as given (`prompt` is
                                    empty; ADD_BOS and PARSE_SPECIAL do not apply). Sent only to
                                    plugins reporting LLMR_CAP_TOKEN_INPUT; an id outside the
                                    vocabulary is LLMR_ERR_UNSUPPORTED naming it. */
    uint32_t constraint_kind;    /* LLMR_CONSTRAINT_*; NONE = unconstrained */
} llmr_infer_request;

/* One alternative token with its log-probability. */
typedef struct llmr_top_logprob {
    int32_t token_id;
    float logprob;
    llmr_str text;
} llmr_top_logprob;

/* One generated token, lent to llmr_token_fn for the duration of the call. */
typedef struct llmr_token {
    uint32_t struct_size;
    int32_t token_id;
    llmr_str text;               /* decoded UTF-8 text this token completes; may be empty while a
                                    multi-byte character or a possible stop sequence is pending.
                                    Held-back text is released by a later token, at the latest by
                                    the last one, so the texts concatenate to the full output. */
    float logprob;               /* log-probability of the chosen token (0 without LOGPROBS) */
    uint32_t top_count;
    const llmr_top_logprob *top; /* top_count alternatives, most likely first; NULL when 0 */
    uint64_t timestamp_ns;       /* monotonic clock of the engine when the token was sampled */
} llmr_token;

/* Receives each token as it is produced. Return false to cancel the request (the engine stops
 * before producing another token and infer returns LLMR_ERR_CANCELLED). */
typedef bool (*llmr_token_fn)(void *user_data, const llmr_token *token);

typedef struct llmr_infer_result {
    uint32_t struct_size;
    uint32_t finish_reason;      /* LLMR_FINISH_* */
    uint32_t prompt_tokens;      /* exact count from the model's tokenizer */
    uint32_t completion_tokens;  /* tokens sampled, including any consumed by a stop sequence */
    uint32_t cached_tokens;      /* prompt tokens whose KV was reused from a previous request */
    uint32_t stop_index;         /* minor 3: 1 + the index in llmr_infer_request.stop of the stop
                                    sequence that ended the generation, 0 for any other end (an
                                    end-of-generation token, a length). Reserved and written as 0
                                    before minor 3: the host reads it only from plugins reporting
                                    abi_minor >= 3. */
    uint64_t prompt_eval_ns;     /* time spent processing the prompt */
    uint64_t generation_ns;      /* time from first to last sampled token */
} llmr_infer_result;

/* ------------------------------------------------------------------------------------------ */
/* Embeddings                                                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef struct llmr_embed_request {
    uint32_t struct_size;
    uint32_t flags;              /* LLMR_EMBED_* */
    uint64_t request_id;
    const char *model_id;
    const llmr_str *inputs;
    size_t input_count;
    /* Minor 1: when not NULL, the inputs are these input_count token lists (`inputs` is NULL).
       Sent only to plugins reporting LLMR_CAP_TOKEN_INPUT. */
    const llmr_tokens *token_inputs;
} llmr_embed_request;

/* Receives the embedding of inputs[index]; `values` is borrowed for the call. Return false to
 * cancel. */
typedef bool (*llmr_embedding_fn)(void *user_data, size_t index, const float *values, size_t dim);

typedef struct llmr_embed_result {
    uint32_t struct_size;
    uint32_t prompt_tokens;      /* tokens over all inputs */
} llmr_embed_result;

/* ------------------------------------------------------------------------------------------ */
/* Speech to text                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct llmr_transcribe_request {
    uint32_t struct_size;
    uint32_t sample_rate;        /* Hz of `samples` */
    uint64_t request_id;
    const char *model_id;
    const float *samples;        /* mono PCM in [-1, 1] */
    size_t sample_count;
    const char *language;        /* ISO 639-1, or NULL to detect */
    const char *prompt;          /* decoding hint, or NULL */
    float temperature;           /* 0: greedy, falling back to higher temperatures when a segment
                                    looks like a failed decode (Whisper's own rule); > 0: sample at
                                    this temperature, no fallback */
    /* Minor 2 (starting at the 1.0 size: see VERSIONING). The host sends flags and beams other
       than 0 only to plugins built against minor >= 2. */
    uint32_t padding_1_0;        /* the 1.0 struct's trailing padding: never read */
    uint32_t flags;              /* LLMR_TRANSCRIBE_* */
    uint32_t beam_size;          /* > 1: beam search with this many beams; 0 or 1: greedy */
    uint32_t reserved;
} llmr_transcribe_request;

/* One word of a segment (minor 2), when LLMR_TRANSCRIBE_WORD_TIMESTAMPS was asked. */
typedef struct llmr_word {
    uint32_t struct_size;
    float probability;           /* mean probability of the word's tokens */
    uint64_t start_ms;
    uint64_t end_ms;
    llmr_str text;               /* as spoken, with its leading space when it has one */
} llmr_word;

typedef struct llmr_segment {
    uint32_t struct_size;
    uint32_t reserved;
    uint64_t start_ms;
    uint64_t end_ms;
    llmr_str text;
    /* Minor 2. */
    const llmr_word *words;      /* word timestamps, or NULL */
    size_t word_count;
    const int32_t *tokens;       /* the segment's text tokens */
    size_t token_count;
    llmr_str language;           /* ISO 639-1 code of the speech (detected or given); may be empty */
    float avg_logprob;           /* mean log-probability of the segment's tokens */
    float no_speech_prob;        /* probability that the segment holds no speech */
    float temperature;           /* the temperature the segment was decoded at */
    uint32_t reserved2;
} llmr_segment;

/* Receives each transcribed segment in order. Return false to cancel. */
typedef bool (*llmr_segment_fn)(void *user_data, const llmr_segment *segment);

/* ------------------------------------------------------------------------------------------ */
/* Text to speech                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct llmr_synthesize_request {
    uint32_t struct_size;
    uint32_t reserved;
    uint64_t request_id;
    const char *model_id;
    llmr_str text;
    const char *voice;           /* engine-specific voice name, or NULL for the default */
    float speed;                 /* 1 = normal; 0 reads as 1 */
} llmr_synthesize_request;

/* Receives consecutive chunks of mono PCM. Return false to cancel. */
typedef bool (*llmr_audio_fn)(void *user_data, const float *samples, size_t sample_count,
                              uint32_t sample_rate);

/* ------------------------------------------------------------------------------------------ */
/* Image generation                                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct llmr_image_request {
    uint32_t struct_size;
    uint32_t width;
    uint32_t height;
    uint32_t steps;              /* 0 = the engine's default */
    uint64_t request_id;
    const char *model_id;
    llmr_str prompt;
    llmr_str negative_prompt;
    float guidance_scale;        /* 0 = the engine's default */
    uint32_t count;              /* images to generate; 0 reads as 1 */
    uint64_t seed;               /* used when seed_set is non-zero */
    uint32_t seed_set;
} llmr_image_request;

/* Receives image `index` as tightly packed 8-bit pixels, `channels` per pixel (3 = RGB, 4 = RGBA).
 * Return false to cancel. */
typedef bool (*llmr_image_fn)(void *user_data, uint32_t index, const uint8_t *pixels,
                              uint32_t width, uint32_t height, uint32_t channels);

/* ------------------------------------------------------------------------------------------ */
/* Exported functions. Every plugin exports all of them (ABI 1.0).                            */
/* ------------------------------------------------------------------------------------------ */

/* The first call the host makes, before any other. Never NULL. */
LLMR_EXPORT const llmr_engine_info *llmr_engine_get_info(void);

/* Create an instance. On success *out receives the handle. On failure *out is left NULL and the
 * message is available from llmr_engine_last_error(NULL) on the same thread. */
LLMR_EXPORT llmr_status llmr_engine_create(const llmr_engine_config *config, llmr_engine **out);

/* Release an instance and everything it holds (models, threads, memory). NULL is a no-op. */
LLMR_EXPORT llmr_status llmr_engine_destroy(llmr_engine *engine);

/* Load a model under desc->model_id. Several models may be loaded per instance. Loading an id
 * that is already loaded fails with LLMR_ERR_LOAD_FAILED. */
LLMR_EXPORT llmr_status llmr_engine_load_model(llmr_engine *engine, const llmr_model_desc *desc);

/* Unload a model. Requests still running on it finish first or are cancelled. */
LLMR_EXPORT llmr_status llmr_engine_unload_model(llmr_engine *engine, const char *model_id);

/* Describe a loaded model as a JSON object written through `write` (one or more calls that
 * together form the document). Known keys (all optional): "architecture", "context_length"
 * (per sequence), "train_context_length", "vocab_size", "embedding_length", "bos_token",
 * "eos_token", "chat_template", "pooling" ("none"|"mean"|"cls"|"last"|"rank"), "quantization",
 * "size_bytes", "parameters", "capabilities" (array of "text", "embedding", ...: what this
 * model, not the engine, can do). */
LLMR_EXPORT llmr_status llmr_engine_model_info(llmr_engine *engine, const char *model_id,
                                               llmr_write_fn write, void *user_data);

/* Tokenize `text` with the model's tokenizer. Writes up to `capacity` ids into `tokens` and the
 * full count into *count. When *count > capacity, nothing useful was written: call again with a
 * larger buffer. `tokens` may be NULL when capacity is 0. `flags`: LLMR_INFER_ADD_BOS,
 * LLMR_INFER_PARSE_SPECIAL. */
LLMR_EXPORT llmr_status llmr_engine_tokenize(llmr_engine *engine, const char *model_id, llmr_str text,
                                             uint32_t flags, int32_t *tokens, size_t capacity,
                                             size_t *count);

/* Generate text, streaming each token to `on_token` (may be NULL to only collect the result).
 * Blocks until the request ends. `result` (may be NULL) receives usage and the finish reason on
 * success, on cancellation and, where possible, on failure. */
LLMR_EXPORT llmr_status llmr_engine_infer(llmr_engine *engine, const llmr_infer_request *request,
                                          llmr_token_fn on_token, void *user_data,
                                          llmr_infer_result *result);

/* Compute one embedding per input, delivered in index order. */
LLMR_EXPORT llmr_status llmr_engine_embed(llmr_engine *engine, const llmr_embed_request *request,
                                          llmr_embedding_fn on_embedding, void *user_data,
                                          llmr_embed_result *result);

/* Transcribe audio. */
LLMR_EXPORT llmr_status llmr_engine_transcribe(llmr_engine *engine,
                                               const llmr_transcribe_request *request,
                                               llmr_segment_fn on_segment, void *user_data);

/* Synthesize speech. */
LLMR_EXPORT llmr_status llmr_engine_synthesize(llmr_engine *engine,
                                               const llmr_synthesize_request *request,
                                               llmr_audio_fn on_audio, void *user_data);

/* Generate images. */
LLMR_EXPORT llmr_status llmr_engine_generate_image(llmr_engine *engine,
                                                   const llmr_image_request *request,
                                                   llmr_image_fn on_image, void *user_data);

/* Ask a running request to stop. Returns LLMR_OK whether or not the request is still running
 * (it may have just finished); the request's own call then returns LLMR_ERR_CANCELLED unless it
 * had already completed. Safe to call from any thread, including from inside a callback. */
LLMR_EXPORT llmr_status llmr_engine_cancel(llmr_engine *engine, uint64_t request_id);

/* Report instance metrics as one JSON object through `write`. Suggested keys: "slots_total",
 * "slots_busy", "requests_total", "tokens_generated_total", "kv_cells_used", "kv_cells_total",
 * "models" (array). */
LLMR_EXPORT llmr_status llmr_engine_get_metrics(llmr_engine *engine, llmr_write_fn write,
                                                void *user_data);

/* Change a runtime setting (e.g. "kv_cache_type" = "\"q8_0\"", "threads" = "4").
 * `model_id` NULL = the whole instance. `value_json` is one JSON value. An unknown key, or a value
 * of the wrong type or range, returns LLMR_ERR_UNSUPPORTED with a message naming the key and what
 * it accepts; the previous setting stays in force. */
LLMR_EXPORT llmr_status llmr_engine_set_config(llmr_engine *engine, const char *model_id,
                                               const char *key, const char *value_json);

/* The message of the last failed call made on `engine` by the calling thread, or of the last
 * failed llmr_engine_create on this thread when `engine` is NULL. Returns "" when there is none.
 * Never NULL. */
LLMR_EXPORT const char *llmr_engine_last_error(const llmr_engine *engine);

/* ------------------------------------------------------------------------------------------ */
/* Function pointer types of the exports, for hosts that resolve them with dlsym.             */
/* ------------------------------------------------------------------------------------------ */
typedef const llmr_engine_info *(*llmr_engine_get_info_fn)(void);
typedef llmr_status (*llmr_engine_create_fn)(const llmr_engine_config *, llmr_engine **);
typedef llmr_status (*llmr_engine_destroy_fn)(llmr_engine *);
typedef llmr_status (*llmr_engine_load_model_fn)(llmr_engine *, const llmr_model_desc *);
typedef llmr_status (*llmr_engine_unload_model_fn)(llmr_engine *, const char *);
typedef llmr_status (*llmr_engine_model_info_fn)(llmr_engine *, const char *, llmr_write_fn, void *);
typedef llmr_status (*llmr_engine_tokenize_fn)(llmr_engine *, const char *, llmr_str, uint32_t,
                                               int32_t *, size_t, size_t *);
typedef llmr_status (*llmr_engine_infer_fn)(llmr_engine *, const llmr_infer_request *,
                                            llmr_token_fn, void *, llmr_infer_result *);
typedef llmr_status (*llmr_engine_embed_fn)(llmr_engine *, const llmr_embed_request *,
                                            llmr_embedding_fn, void *, llmr_embed_result *);
typedef llmr_status (*llmr_engine_transcribe_fn)(llmr_engine *, const llmr_transcribe_request *,
                                                 llmr_segment_fn, void *);
typedef llmr_status (*llmr_engine_synthesize_fn)(llmr_engine *, const llmr_synthesize_request *,
                                                 llmr_audio_fn, void *);
typedef llmr_status (*llmr_engine_generate_image_fn)(llmr_engine *, const llmr_image_request *,
                                                     llmr_image_fn, void *);
typedef llmr_status (*llmr_engine_cancel_fn)(llmr_engine *, uint64_t);
typedef llmr_status (*llmr_engine_get_metrics_fn)(llmr_engine *, llmr_write_fn, void *);
typedef llmr_status (*llmr_engine_set_config_fn)(llmr_engine *, const char *, const char *,
                                                 const char *);
typedef const char *(*llmr_engine_last_error_fn)(const llmr_engine *);

#ifdef __cplusplus
}
#endif

#endif /* LLMR_ENGINE_H */
