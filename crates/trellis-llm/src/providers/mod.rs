//! One adapter per native provider API.

mod anthropic;
mod gemini;
pub(crate) mod openai_chat;
mod openai_responses;

pub use anthropic::Anthropic;
pub use gemini::Gemini;
pub use openai_chat::OpenAiChat;
pub use openai_responses::OpenAiResponses;
