//! Any bytes as a request body of each protocol: never a panic.
#![no_main]

use deepinfer_recipe::protocol::anthropic::MessagesRequest;
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::responses::convert_request;
use deepinfer_recipe::protocol::ConversionOptions;
use deepinfer_recipe::Renderer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else { return };
    let options = ConversionOptions::default();
    let converted = [
        ChatRequest::from_json(body).and_then(|r| r.convert(&options)),
        MessagesRequest::from_json(body).and_then(|r| r.convert(&options)),
        convert_request(body, &options),
    ];
    for request in converted.into_iter().flatten() {
        let _ = Renderer::new(request.format).render(&request.conversation);
    }
});
