//! `deepinfer serve` over loopback HTTP, as clients call it: every route, streaming and
//! not, the error shapes, disconnects, the queue bound, determinism among concurrent
//! requests, and a bounded load test with misbehaving clients.
#![cfg(feature = "server")]

mod http;

use deepinfer_engine::runtime::EngineConfig;
use deepinfer_engine::server::ServerConfig;
use http::{TestServer, eventually, get, post, raw, request_bytes, send, start};
use serde_json::{Value, json};
use std::io::Read;
use std::sync::OnceLock;

fn server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| start(EngineConfig::default(), 256, ServerConfig::default()))
}

fn chat_body(content: &str, max_tokens: u64, seed: u64) -> Value {
    json!({
        "model": "deepinfer",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": seed,
        // Every token up to the limit: the embedded model is trained and may end early.
        "ignore_eos": true,
    })
}

/// The streamed chat deltas of one choice, joined.
fn streamed_content(events: &[(Option<String>, String)]) -> String {
    events
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn chat_completion_non_streamed() {
    let s = server();
    let r = post(s.addr, "/v1/chat/completions", &chat_body("Hello", 6, 1));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].is_string());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn streamed_chat_equals_the_complete_answer_and_ends_with_usage_and_done() {
    let s = server();
    let body = chat_body("Tell me something", 12, 77);
    let whole = post(s.addr, "/v1/chat/completions", &body).json();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let r = post(s.addr, "/v1/chat/completions", &sb);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let ev = r.events();
    assert_eq!(ev.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&json!("length")]);
    // Same seed: the stream carries exactly the non-streamed text.
    assert_eq!(
        streamed_content(&ev),
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[test]
fn n_choices_and_logprobs() {
    let s = server();
    let mut b = chat_body("Hi", 5, 3);
    b["n"] = json!(3);
    b["logprobs"] = json!(true);
    b["top_logprobs"] = json!(2);
    let v = post(s.addr, "/v1/chat/completions", &b).json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let lp = c["logprobs"]["content"].as_array().unwrap();
        assert_eq!(lp.len(), 5);
        assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 2);
    }
    // Streamed: every token's log-probability and alternatives, in the chunks.
    b["n"] = json!(1);
    b["stream"] = json!(true);
    let ev = post(s.addr, "/v1/chat/completions", &b).events();
    let entries: Vec<Value> = ev
        .iter()
        .filter(|e| e.1 != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(&e.1).ok())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(entries.len(), 5, "{ev:?}");
    for e in &entries {
        assert!(e["logprob"].is_number());
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2, "{e}");
    }
}

#[test]
fn json_schema_answer_parses() {
    let s = server();
    let mut b = chat_body("Give me a person", 60, 5);
    b["response_format"] = json!({
        "type": "json_schema",
        "json_schema": {"name": "p", "strict": true, "schema": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false,
        }},
    });
    let v = post(s.addr, "/v1/chat/completions", &b).json();
    let c = &v["choices"][0];
    if c["finish_reason"] == "stop" {
        let parsed: Value =
            serde_json::from_str(c["message"]["content"].as_str().unwrap()).expect("JSON");
        assert!(
            parsed["name"].is_string() && parsed["age"].is_i64(),
            "{parsed}"
        );
    }
}

#[test]
fn anthropic_messages_streamed_and_not() {
    let s = server();
    let b = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]});
    let v = post(s.addr, "/v1/messages", &b).json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["content"][0]["type"], "text");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let ev = post(s.addr, "/v1/messages", &sb).events();
    let names: Vec<&str> = ev.iter().filter_map(|e| e.0.as_deref()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert!(names.contains(&"content_block_delta"));
}

#[test]
fn responses_streamed_and_not() {
    let s = server();
    let b = json!({"model": "m", "input": "Hello there", "max_output_tokens": 4});
    let v = post(s.addr, "/v1/responses", &b).json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["type"], "message");
    // Cut by max_output_tokens: incomplete, with the reason.
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let ev = post(s.addr, "/v1/responses", &sb).events();
    let names: Vec<&str> = ev.iter().filter_map(|e| e.0.as_deref()).collect();
    assert_eq!(names.first(), Some(&"response.created"));
    assert!(names.contains(&"response.output_text.delta"), "{names:?}");
    assert_eq!(names.last(), Some(&"response.incomplete"));
}

#[test]
fn legacy_completions_text_and_token_ids() {
    let s = server();
    let v = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Once upon", "max_tokens": 4, "seed": 9}),
    )
    .json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    let ids = post(s.addr, "/tokenize", &json!({"prompt": "Once upon"})).json();
    let toks = ids["tokens"].clone();
    assert_eq!(ids["count"], toks.as_array().unwrap().len());
    // The same prompt as token ids, same seed: the same text.
    let w = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": toks, "max_tokens": 4, "seed": 9}),
    )
    .json();
    assert_eq!(v["choices"][0]["text"], w["choices"][0]["text"]);
    let back = post(s.addr, "/detokenize", &json!({"tokens": ids["tokens"]})).json();
    assert!(back["prompt"].as_str().unwrap().ends_with("Once upon"));
    let mut st = json!({"prompt": "Once upon", "max_tokens": 3, "stream": true});
    st["stream_options"] = json!({"include_usage": true});
    let ev = post(s.addr, "/v1/completions", &st).events();
    assert_eq!(ev.last().map(|e| e.1.as_str()), Some("[DONE]"));
}

#[test]
fn models_health_and_metrics() {
    let s = server();
    let m = get(s.addr, "/v1/models").json();
    assert_eq!(m["data"][0]["id"], "deepinfer");
    assert_eq!(get(s.addr, "/health").status, 200);
    post(s.addr, "/v1/chat/completions", &chat_body("count me", 3, 4));
    let text = get(s.addr, "/metrics").body;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:request_queue_time_seconds_bucket",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
}

#[test]
fn bad_requests_get_the_protocol_error_shape_and_the_server_keeps_serving() {
    let s = server();
    let bad = |path: &str, body: &str| raw(s.addr, &request_bytes("POST", path, body));
    let cases = [
        ("/v1/chat/completions", "{\"model\": ", 400),
        ("/v1/chat/completions", "[1, 2]", 400),
        ("/v1/chat/completions", "{\"messages\": \"hi\"}", 400),
        (
            "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": -1}",
            400,
        ),
        (
            "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": \"many\"}",
            400,
        ),
        ("/v1/completions", "{\"prompt\": [999999999]}", 400),
        (
            "/v1/completions",
            "{\"prompt\": \"x\", \"n\": \"two\"}",
            400,
        ),
        ("/v1/completions", "{}", 400),
        ("/detokenize", "{\"tokens\": [1, -3]}", 400),
        ("/v1/nowhere", "{}", 404),
    ];
    for (path, body, want) in cases {
        let r = bad(path, body);
        assert_eq!(r.status, want, "{path} {body}: {}", r.body);
        let v = r.json();
        assert!(v["error"]["message"].is_string(), "{path} {body}: {v}");
    }
    // Anthropic's shape on /v1/messages.
    let r = bad("/v1/messages", "{\"messages\": []}");
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert!(v["error"]["message"].is_string());
    // Wrong method.
    assert_eq!(get(s.addr, "/v1/chat/completions").status, 405);
    // Too large: 413 before reading it all.
    let big = format!("{{\"a\": \"{}\"}}", "x".repeat(5 << 20));
    let r = bad("/v1/chat/completions", &big);
    assert_eq!(r.status, 413);
    // A prompt beyond the context.
    let long = "word ".repeat(9000);
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    // Still serving.
    assert_eq!(
        post(s.addr, "/v1/chat/completions", &chat_body("ok?", 2, 0)).status,
        200
    );
}

#[test]
fn a_client_that_disconnects_mid_stream_aborts_its_request() {
    // A server of its own, so the gauges see only this request.
    let s = start(EngineConfig::default(), 8, ServerConfig::default());
    let mut b = chat_body("a long answer please", 4000, 2);
    b["stream"] = json!(true);
    let mut c = send(s.addr, "/v1/chat/completions", &b);
    let mut buf = [0u8; 2048];
    let mut got = 0;
    while got < 1500 {
        got += c.read(&mut buf).unwrap();
    }
    assert!(s.online.stats().outstanding == 1);
    drop(c);
    assert!(
        eventually(20, || {
            let st = s.online.stats();
            st.outstanding == 0 && st.running == 0
        }),
        "{:?}",
        s.online.stats()
    );
}

#[test]
fn a_full_queue_answers_429() {
    let s = start(
        EngineConfig {
            max_num_seqs: 1,
            ..EngineConfig::default()
        },
        0,
        ServerConfig::default(),
    );
    let mut b = chat_body("hold the slot", 3000, 1);
    b["stream"] = json!(true);
    let c = send(s.addr, "/v1/chat/completions", &b);
    assert!(eventually(20, || s.online.stats().outstanding == 1));
    let r = post(s.addr, "/v1/chat/completions", &chat_body("me too", 2, 1));
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.json()["error"]["message"].is_string());
    drop(c);
    assert!(eventually(20, || s.online.stats().outstanding == 0));
    assert_eq!(
        post(s.addr, "/v1/chat/completions", &chat_body("now", 2, 1)).status,
        200
    );
}

#[test]
fn a_seeded_request_gives_the_same_tokens_alone_and_among_63_others() {
    let s = server();
    let mut target = chat_body("the target request", 10, 4242);
    target["logprobs"] = json!(true);
    let alone = post(s.addr, "/v1/chat/completions", &target).json();
    let addr = s.addr;
    let others: Vec<_> = (0..63u64)
        .map(|i| {
            std::thread::spawn(move || {
                post(
                    addr,
                    "/v1/chat/completions",
                    &chat_body(&format!("other {i}"), 6 + i % 7, i),
                )
                .status
            })
        })
        .collect();
    let together = post(s.addr, "/v1/chat/completions", &target).json();
    for o in others {
        assert_eq!(o.join().unwrap(), 200);
    }
    let ids = |v: &Value| {
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["token_id"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&alone), ids(&together));
    assert_eq!(
        alone["choices"][0]["message"]["content"],
        together["choices"][0]["message"]["content"]
    );
}

/// 128 concurrent streaming clients, every fourth disconnecting mid-stream and every
/// eighth sending garbage: every well-formed request that stays completes exactly once,
/// garbage gets 400, and the engine ends with nothing outstanding.
#[test]
fn bounded_load_with_disconnects_and_garbage() {
    let s = start(EngineConfig::default(), 256, ServerConfig::default());
    let addr = s.addr;
    let clients: Vec<_> = (0..128u64)
        .map(|i| {
            std::thread::spawn(move || {
                if i % 8 == 7 {
                    let r = raw(
                        addr,
                        &request_bytes("POST", "/v1/chat/completions", "{nope"),
                    );
                    return ("garbage", r.status, 0);
                }
                let mut b = chat_body(&format!("client {i}"), 8 + i % 5, i);
                b["stream"] = json!(true);
                if i % 4 == 1 {
                    let mut c = send(addr, "/v1/chat/completions", &b);
                    let mut buf = [0u8; 256];
                    let _ = c.read(&mut buf);
                    return ("gone", 0, 0);
                }
                let r = http::post(addr, "/v1/chat/completions", &b);
                let ev = r.events();
                let done = ev.iter().filter(|e| e.1 == "[DONE]").count();
                ("ok", r.status, done)
            })
        })
        .collect();
    for c in clients {
        let (kind, status, done) = c.join().unwrap();
        match kind {
            "garbage" => assert_eq!(status, 400),
            "ok" => assert_eq!((status, done), (200, 1)),
            _ => {}
        }
    }
    assert!(
        eventually(30, || {
            let st = s.online.stats();
            st.outstanding == 0 && st.running == 0 && st.waiting == 0
        }),
        "{:?}",
        s.online.stats()
    );
}

#[test]
fn reset_prefix_cache_forgets_cached_prompts() {
    let s = server();
    let body = chat_body(
        "A prompt long enough to span several cache blocks: the quick brown fox jumps over \
         the lazy dog, again and again, until the cache has something to keep for later.",
        2,
        5,
    );
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let first = post(s.addr, "/v1/chat/completions", &body).json();
    assert_eq!(cached(&first), Some(0), "{first}");
    let again = post(s.addr, "/v1/chat/completions", &body).json();
    assert!(cached(&again).unwrap() > 0, "{again}");
    assert_eq!(post(s.addr, "/reset_prefix_cache", &json!({})).status, 200);
    let after = post(s.addr, "/v1/chat/completions", &body).json();
    assert_eq!(cached(&after), Some(0), "{after}");
    assert_eq!(first["choices"], after["choices"]);
}
