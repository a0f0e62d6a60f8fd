/*
 * A minimal llmr engine plugin in C, written from llmr_engine.h alone. Copy this folder to start
 * your own engine.
 *
 * The "model" is any existing file; "generation" echoes the words of the prompt back one token at
 * a time, deterministically. It shows every rule a plugin must follow:
 *   - every export exists; unsupported ones return LLMR_ERR_UNSUPPORTED with a message;
 *   - struct_size is checked on input and honoured on output;
 *   - streaming goes through the callback, which may cancel by returning false;
 *   - llmr_engine_cancel works from any thread;
 *   - errors leave a per-thread message for llmr_engine_last_error.
 *
 * Build: cc -std=c11 -O2 -shared -fPIC -I ../include echo_engine.c -o libllmr_c_echo.so -lpthread
 * (or cmake -S . -B build && cmake --build build), then put the library beside manifest.json in
 * engines/c_echo/cpu/ and run `llmr engines check engines/c_echo/cpu`.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "llmr_engine.h"

#include <ctype.h>
#include <stddef.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Tests build variants with another major version, id or version to check that the host
 * refuses them, tells them apart, or replaces one version with the next while serving. */
#ifndef ECHO_ABI_MAJOR
#define ECHO_ABI_MAJOR LLMR_ENGINE_ABI_MAJOR
#endif
#ifndef ECHO_ENGINE_ID
#define ECHO_ENGINE_ID "c_echo"
#endif
#ifndef ECHO_VERSION
#define ECHO_VERSION "0.1.0"
#endif

/* A test variant whose library crashes as it is opened (its initialiser aborts), as a plugin
 * built against a missing or broken GPU runtime can: the node must survive opening it. */
#ifdef ECHO_CRASH_ON_OPEN
__attribute__((constructor)) static void crash_on_open(void) { abort(); }
#endif

#define MAX_MODELS 16
#define MAX_RUNNING 64
#define MODEL_ID_MAX 256

struct running {
    uint64_t request_id;
    int in_use;
    volatile int cancelled; /* written under the lock, read by the generating thread */
};

struct llmr_engine {
    pthread_mutex_t lock;
    char models[MAX_MODELS][MODEL_ID_MAX];
    struct running running[MAX_RUNNING];
    uint64_t requests_total;
    llmr_log_fn log_fn;
    void *log_user_data;
};

/* ---- last error: one buffer per thread, tagged with the handle it belongs to ---- */
static _Thread_local char t_error[512];
static _Thread_local const llmr_engine *t_error_owner;

static llmr_status fail(const llmr_engine *e, llmr_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_error, sizeof t_error, fmt, ap);
    va_end(ap);
    t_error_owner = e;
    return code;
}

static const llmr_engine_info INFO = {
    sizeof(llmr_engine_info), ECHO_ABI_MAJOR, LLMR_ENGINE_ABI_MINOR, LLMR_CAP_TEXT, ECHO_ENGINE_ID, ECHO_VERSION,
};

LLMR_EXPORT const llmr_engine_info *llmr_engine_get_info(void) { return &INFO; }

LLMR_EXPORT llmr_status llmr_engine_create(const llmr_engine_config *config, llmr_engine **out) {
    if (!out) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `out` is NULL");
    *out = NULL;
    if (!config) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `config` is NULL");
    if (config->struct_size < sizeof(llmr_engine_config))
        return fail(NULL, LLMR_ERR_ABI_MISMATCH, "config.struct_size %u is smaller than ABI 1.0's %zu",
                    config->struct_size, sizeof(llmr_engine_config));
    llmr_engine *e = calloc(1, sizeof *e);
    if (!e) return fail(NULL, LLMR_ERR_OOM_RAM, "out of memory");
    pthread_mutex_init(&e->lock, NULL);
    e->log_fn = config->log_fn;
    e->log_user_data = config->log_user_data;
    if (e->log_fn) {
        const char msg[] = "c_echo engine created";
        e->log_fn(e->log_user_data, LLMR_LOG_INFO, msg, sizeof msg - 1);
    }
    *out = e;
    return LLMR_OK;
}

LLMR_EXPORT llmr_status llmr_engine_destroy(llmr_engine *e) {
    if (!e) return LLMR_OK;
    pthread_mutex_destroy(&e->lock);
    free(e);
    return LLMR_OK;
}

/* Index of a loaded model, or -1. Caller holds the lock. */
static int find_model(llmr_engine *e, const char *id) {
    for (int i = 0; i < MAX_MODELS; i++)
        if (e->models[i][0] && strcmp(e->models[i], id) == 0) return i;
    return -1;
}

static llmr_status require_model(llmr_engine *e, const char *id) {
    if (!id) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `model_id` is NULL");
    pthread_mutex_lock(&e->lock);
    int found = find_model(e, id);
    pthread_mutex_unlock(&e->lock);
    return found < 0 ? fail(e, LLMR_ERR_LOAD_FAILED, "model '%s' is not loaded", id) : LLMR_OK;
}

LLMR_EXPORT llmr_status llmr_engine_load_model(llmr_engine *e, const llmr_model_desc *d) {
    if (!e) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `engine` is NULL");
    if (!d) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `desc` is NULL");
    if (d->struct_size < sizeof(llmr_model_desc))
        return fail(e, LLMR_ERR_ABI_MISMATCH, "desc.struct_size %u is too small", d->struct_size);
    if (!d->model_id || !d->primary_file)
        return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `desc.model_id` or `desc.primary_file` is NULL");
    if (strlen(d->model_id) >= MODEL_ID_MAX) return fail(e, LLMR_ERR_LOAD_FAILED, "model id is too long");
    struct stat st;
    if (stat(d->primary_file, &st) != 0 || !S_ISREG(st.st_mode))
        return fail(e, LLMR_ERR_LOAD_FAILED, "model file not found: %s", d->primary_file);
    llmr_status status = LLMR_OK;
    pthread_mutex_lock(&e->lock);
    if (find_model(e, d->model_id) >= 0) {
        status = fail(e, LLMR_ERR_LOAD_FAILED, "model '%s' is already loaded", d->model_id);
    } else {
        int slot = -1;
        for (int i = 0; i < MAX_MODELS && slot < 0; i++)
            if (!e->models[i][0]) slot = i;
        if (slot < 0) status = fail(e, LLMR_ERR_OOM_RAM, "at most %d models per instance", MAX_MODELS);
        else snprintf(e->models[slot], MODEL_ID_MAX, "%s", d->model_id);
    }
    pthread_mutex_unlock(&e->lock);
    return status;
}

LLMR_EXPORT llmr_status llmr_engine_unload_model(llmr_engine *e, const char *model_id) {
    if (!e) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `engine` is NULL");
    if (!model_id) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `model_id` is NULL");
    pthread_mutex_lock(&e->lock);
    int i = find_model(e, model_id);
    if (i >= 0) e->models[i][0] = '\0';
    pthread_mutex_unlock(&e->lock);
    return i < 0 ? fail(e, LLMR_ERR_LOAD_FAILED, "model '%s' is not loaded", model_id) : LLMR_OK;
}

LLMR_EXPORT llmr_status llmr_engine_model_info(llmr_engine *e, const char *model_id, llmr_write_fn write,
                                               void *user_data) {
    if (!e) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `engine` is NULL");
    llmr_status s = require_model(e, model_id);
    if (s != LLMR_OK) return s;
    if (!write) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `write` is NULL");
    const char json[] = "{\"architecture\":\"echo\",\"context_length\":4096,\"vocab_size\":65536}";
    write(user_data, json, sizeof json - 1);
    return LLMR_OK;
}

/* Words of the prompt: each token is a maximal run of non-space bytes. */
static uint32_t word_id(const char *p, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h % 65534u + 2u;
}

LLMR_EXPORT llmr_status llmr_engine_tokenize(llmr_engine *e, const char *model_id, llmr_str text, uint32_t flags,
                                             int32_t *tokens, size_t capacity, size_t *count) {
    if (!e) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `engine` is NULL");
    llmr_status s = require_model(e, model_id);
    if (s != LLMR_OK) return s;
    if (!count) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `count` is NULL");
    if (!text.ptr && text.len) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `text.ptr` is NULL");
    size_t n = 0;
    if (flags & LLMR_INFER_ADD_BOS) {
        if (n < capacity && tokens) tokens[n] = 1;
        n++;
    }
    size_t i = 0;
    while (i < text.len) {
        while (i < text.len && isspace((unsigned char)text.ptr[i])) i++;
        size_t start = i;
        while (i < text.len && !isspace((unsigned char)text.ptr[i])) i++;
        if (i > start) {
            if (n < capacity && tokens) tokens[n] = (int32_t)word_id(text.ptr + start, i - start);
            n++;
        }
    }
    *count = n;
    return LLMR_OK;
}

/* Registers a running request so llmr_engine_cancel can find it. Returns its slot or -1. */
static int begin_request(llmr_engine *e, uint64_t id) {
    int slot = -1;
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < MAX_RUNNING && slot < 0; i++)
        if (!e->running[i].in_use) slot = i;
    if (slot >= 0) {
        e->running[slot].in_use = 1;
        e->running[slot].cancelled = 0;
        e->running[slot].request_id = id;
        e->requests_total++;
    }
    pthread_mutex_unlock(&e->lock);
    return slot;
}

static int is_cancelled(llmr_engine *e, int slot) {
    pthread_mutex_lock(&e->lock);
    int c = e->running[slot].cancelled;
    pthread_mutex_unlock(&e->lock);
    return c;
}

static void end_request(llmr_engine *e, int slot) {
    pthread_mutex_lock(&e->lock);
    e->running[slot].in_use = 0;
    pthread_mutex_unlock(&e->lock);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

LLMR_EXPORT llmr_status llmr_engine_infer(llmr_engine *e, const llmr_infer_request *r, llmr_token_fn on_token,
                                          void *user_data, llmr_infer_result *result) {
    if (!e) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `engine` is NULL");
    if (!r) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `request` is NULL");
    /* ABI 1.0's fields are all this engine reads; a 1.0 host sends exactly those (minor 1's
       constraint and token ids start at offsetof(..., constraint) and are not for this engine). */
    if (r->struct_size < offsetof(llmr_infer_request, constraint))
        return fail(e, LLMR_ERR_ABI_MISMATCH, "request.struct_size %u is too small", r->struct_size);
    llmr_status s = require_model(e, r->model_id);
    if (s != LLMR_OK) return s;
    if (!r->prompt.ptr && r->prompt.len) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `prompt.ptr` is NULL");

    int slot = begin_request(e, r->request_id);
    if (slot < 0) return fail(e, LLMR_ERR_OOM_RAM, "more than %d concurrent requests", MAX_RUNNING);

    uint64_t start = now_ns();
    uint32_t prompt_tokens = (r->flags & LLMR_INFER_ADD_BOS) ? 1 : 0, completion = 0;
    uint32_t finish = LLMR_FINISH_STOP;
    const char *p = r->prompt.ptr;
    size_t n = r->prompt.len, i = 0;
    size_t prev_end = 0; /* the text between words goes with the next word */
    int first = 1;
    while (i < n) {
        while (i < n && isspace((unsigned char)p[i])) i++;
        size_t begin = i;
        while (i < n && !isspace((unsigned char)p[i])) i++;
        if (i == begin) break;
        prompt_tokens++;
        if (finish != LLMR_FINISH_STOP) continue; /* keep counting prompt tokens */
        if (is_cancelled(e, slot)) { finish = LLMR_FINISH_CANCELLED; continue; }
        if (r->max_tokens && completion >= r->max_tokens) { finish = LLMR_FINISH_LENGTH; continue; }
        /* A token's text is the word with the whitespace before it, except for the first. */
        size_t start_off = first ? begin : prev_end;
        first = 0;
        prev_end = i;
        completion++;
        llmr_token tok = {sizeof(llmr_token), (int32_t)word_id(p + begin, i - begin),
                          {p + start_off, i - start_off}, 0.0f, 0, NULL, now_ns() - start};
        if (on_token && !on_token(user_data, &tok)) finish = LLMR_FINISH_CANCELLED;
    }
    end_request(e, slot);

    if (result && result->struct_size >= sizeof(llmr_infer_result)) {
        uint32_t size = result->struct_size;
        memset(result, 0, sizeof *result);
        result->struct_size = size;
        result->finish_reason = finish;
        result->prompt_tokens = prompt_tokens;
        result->completion_tokens = completion;
        result->generation_ns = now_ns() - start;
    }
    return finish == LLMR_FINISH_CANCELLED ? fail(e, LLMR_ERR_CANCELLED, "request cancelled") : LLMR_OK;
}

LLMR_EXPORT llmr_status llmr_engine_embed(llmr_engine *e, const llmr_embed_request *r, llmr_embedding_fn f, void *u,
                                          llmr_embed_result *res) {
    (void)r, (void)f, (void)u, (void)res;
    return fail(e, LLMR_ERR_UNSUPPORTED, "embeddings are not supported by c_echo");
}

LLMR_EXPORT llmr_status llmr_engine_transcribe(llmr_engine *e, const llmr_transcribe_request *r, llmr_segment_fn f,
                                               void *u) {
    (void)r, (void)f, (void)u;
    return fail(e, LLMR_ERR_UNSUPPORTED, "transcription is not supported by c_echo");
}

LLMR_EXPORT llmr_status llmr_engine_synthesize(llmr_engine *e, const llmr_synthesize_request *r, llmr_audio_fn f,
                                               void *u) {
    (void)r, (void)f, (void)u;
    return fail(e, LLMR_ERR_UNSUPPORTED, "speech synthesis is not supported by c_echo");
}

LLMR_EXPORT llmr_status llmr_engine_generate_image(llmr_engine *e, const llmr_image_request *r, llmr_image_fn f,
                                                   void *u) {
    (void)r, (void)f, (void)u;
    return fail(e, LLMR_ERR_UNSUPPORTED, "image generation is not supported by c_echo");
}

LLMR_EXPORT llmr_status llmr_engine_cancel(llmr_engine *e, uint64_t request_id) {
    if (!e) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `engine` is NULL");
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < MAX_RUNNING; i++)
        if (e->running[i].in_use && e->running[i].request_id == request_id) e->running[i].cancelled = 1;
    pthread_mutex_unlock(&e->lock);
    return LLMR_OK;
}

LLMR_EXPORT llmr_status llmr_engine_get_metrics(llmr_engine *e, llmr_write_fn write, void *user_data) {
    if (!e) return fail(NULL, LLMR_ERR_INTERNAL, "invalid argument: `engine` is NULL");
    if (!write) return fail(e, LLMR_ERR_INTERNAL, "invalid argument: `write` is NULL");
    char json[128];
    pthread_mutex_lock(&e->lock);
    int n = snprintf(json, sizeof json, "{\"requests_total\":%llu}", (unsigned long long)e->requests_total);
    pthread_mutex_unlock(&e->lock);
    write(user_data, json, (size_t)n);
    return LLMR_OK;
}

LLMR_EXPORT llmr_status llmr_engine_set_config(llmr_engine *e, const char *model_id, const char *key,
                                               const char *value_json) {
    (void)model_id, (void)value_json;
    return fail(e, LLMR_ERR_UNSUPPORTED, "unknown setting `%s` (c_echo has none)", key ? key : "(null)");
}

LLMR_EXPORT const char *llmr_engine_last_error(const llmr_engine *e) {
    return t_error_owner == e ? t_error : "";
}
