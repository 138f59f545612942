//! What the runtime decodes from a sandbox's agent (`lockbox_agent::Message`, one JSON
//! document per record) and the agent's runner event frames (`contexts::decode_event`): the
//! agent runs inside the sandbox, so a hostile command can write these bytes. Also what the
//! agent decodes from the runtime (`Request`). Never panics; a message that decodes encodes
//! and decodes again to the same JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_agent::contexts::{decode_event, Frame};
use lockbox_agent::{Message, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = serde_json::from_slice::<Message>(data) {
        let once = serde_json::to_value(&msg).expect("a decoded message encodes");
        let again: Message = serde_json::from_value(once.clone()).expect("and decodes again");
        assert_eq!(serde_json::to_value(&again).ok(), Some(once));
    }
    if let Ok(req) = serde_json::from_slice::<Request>(data) {
        let once = serde_json::to_value(&req).expect("a decoded request encodes");
        let again: Request = serde_json::from_value(once.clone()).expect("and decodes again");
        assert_eq!(serde_json::to_value(&again).ok(), Some(once));
    }
    if let Frame::Event(_, used) = decode_event(data) {
        assert!(used <= data.len());
    }
});
