//! Render + encode of the golden-dev requests, side by side with DeepSeek's
//! `deepseek-recipe-encoding` 0.2.0 in the same run (ids checked equal first).

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../tests/reference/mod.rs"]
mod reference;

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::ConversionOptions;
use deepinfer_recipe::{Conversation, PromptFormat, PromptTokenizer, Renderer, SpecialToken};
use deepseek_recipe_encoding::dsv4::DeepseekV4Encoding;
use deepseek_recipe_encoding::dsv41::DeepseekV41Encoding;
use deepseek_recipe_encoding::{PromptEncoding, PromptTokenizer as RefTokenizer};
use reference::to_reference;

fn tokenizer_with_system() -> Arc<PromptTokenizer> {
    Arc::new(
        PromptTokenizer::deepseek_v4()
            .unwrap()
            .with_special_id(SpecialToken::System.deepseek_spelling(), 129_280),
    )
}

fn golden_render_encode(c: &mut Criterion) {
    let tokenizer = tokenizer_with_system();
    let conversations: Vec<(PromptFormat, Conversation)> = common::golden_requests()
        .iter()
        .filter(|case| case["error"].is_null())
        .map(|case| {
            let converted = ChatRequest::from_json(&case["request"].to_string())
                .and_then(|r| r.convert(&ConversionOptions::default()))
                .unwrap();
            (converted.format, converted.conversation)
        })
        .collect();
    let references: Vec<_> = conversations
        .iter()
        .map(|(f, c)| (*f, to_reference(c)))
        .collect();
    let mut reference_tokenizer =
        tokenizers::Tokenizer::from_bytes(tokenizer_json()).expect("reference tokenizer loads");
    reference_tokenizer
        .add_special_tokens(vec![tokenizers::AddedToken::from(
            SpecialToken::System.deepseek_spelling(),
            true,
        )])
        .expect("the system token is added");
    let reference_v4 =
        DeepseekV4Encoding::new().with_tokenizer(RefTokenizer::new(&reference_tokenizer));
    let reference_v41 =
        DeepseekV41Encoding::new().with_tokenizer(RefTokenizer::new(&reference_tokenizer));
    // Same ids on both sides (the reference gives <｜System｜> the next id).
    assert_eq!(
        reference_tokenizer.token_to_id(SpecialToken::System.deepseek_spelling()),
        Some(129_280)
    );
    for ((format, ours), (_, theirs)) in conversations.iter().zip(&references) {
        let our_ids = tokenizer
            .encode(&Renderer::new(*format).render(ours))
            .unwrap();
        let their_ids = match format {
            PromptFormat::V4 => reference_v4.encode(theirs).unwrap(),
            PromptFormat::V41 => reference_v41.encode(theirs).unwrap(),
        };
        assert_eq!(our_ids, their_ids);
    }
    let mut group = c.benchmark_group("golden_dev_render_encode");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(conversations.len() as u64));
    group.bench_function("deepinfer_recipe", |b| {
        b.iter(|| {
            let mut total = 0;
            for (format, conversation) in &conversations {
                let rendered = Renderer::new(*format).render(conversation);
                total += tokenizer.encode(&rendered).unwrap().len();
            }
            total
        })
    });
    group.bench_function("deepseek_recipe_0_2_0", |b| {
        b.iter(|| {
            let mut total = 0;
            for (format, conversation) in &references {
                total += match format {
                    PromptFormat::V4 => reference_v4.encode(conversation).unwrap().len(),
                    PromptFormat::V41 => reference_v41.encode(conversation).unwrap().len(),
                };
            }
            total
        })
    });
    group.finish();
}

fn tokenizer_json() -> Vec<u8> {
    use std::io::Read;
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&include_bytes!("../../data/deepseek-v4-tokenizer.json.gz")[..])
        .read_to_end(&mut json)
        .unwrap();
    json
}

criterion_group!(benches, golden_render_encode);
criterion_main!(benches);
