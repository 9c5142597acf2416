//! Delivery id parsing: any text either parses to an id that formats back to the same text
//! (one spelling per id) or is refused with an error that explains itself. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unimesh_core::DeliveryId;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<DeliveryId>() {
        Ok(id) => assert_eq!(id.to_string(), text, "an id has exactly one spelling"),
        Err(e) => assert!(!e.to_string().is_empty(), "errors explain themselves"),
    }
});
