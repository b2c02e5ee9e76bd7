//! The buffered stream-parser path allocates nothing per push: a counting
//! global allocator checks it over a realistic stream (prose, code, CJK,
//! line ends, a `</think>`), one token per push.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deepinfer_recipe::protocol::{ParsingOptions, ThinkingStart};
use deepinfer_recipe::{EventBuffer, StreamParser};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's
// arguments unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's (non-zero size layout).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` with `layout`; forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn buffered_pushes_do_not_allocate_per_token() {
    let tokenizer = common::tokenizer();
    let mut ids = tokenizer
        .encode_plain(&common::corpus(&tokenizer, 20_000))
        .unwrap();
    ids.push(tokenizer.special_id("</think>").unwrap());
    ids.extend(
        tokenizer
            .encode_plain(&common::corpus(&tokenizer, 20_000))
            .unwrap(),
    );
    let options = ParsingOptions {
        parse_tool_calls: true,
        starts_in_tool_calls: false,
        parse_json_output: false,
        thinking: Some(ThinkingStart::ReasoningStart),
        stop_sequences: vec!["<|stop|>".into()],
    };
    let run = |ids: &[u32], buffer: &mut EventBuffer| {
        let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
        let mut events = 0;
        for id in ids.chunks(1) {
            parser.push_tokens_buffered(id, buffer);
            events += buffer.len();
            buffer.clear();
        }
        events
    };
    let mut buffer = EventBuffer::with_capacity(16, 1024);
    // Warm up: tables built on first use, buffers grown.
    run(&ids, &mut buffer);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let events = run(&ids, &mut buffer);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(events > ids.len() / 2, "{events} events");
    // Parser setup and the amortised growth of its internal buffers (the
    // reasoning text, kept for the finish's token count) only: far below
    // one per push.
    assert!(
        allocations < 200,
        "{allocations} allocations for {} pushes",
        ids.len()
    );
    // The old API allocates for every text event.
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
    for id in ids.chunks(1) {
        drop(parser.push_tokens(id));
    }
    let old = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(old > ids.len() / 2, "old path: {old} allocations");
    eprintln!(
        "{} one-token pushes: buffered {allocations} allocations, push_tokens {old}",
        ids.len()
    );
}
