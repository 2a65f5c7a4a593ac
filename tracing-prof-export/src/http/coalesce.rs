//! Identical requests answered at once share one answer, as Go's `singleflight` shares a call:
//! a request asking what a request being answered asks (the same method, path and query,
//! `Authorization` and `Accept`: all a [`PprofHandler`](super::PprofHandler) reads) waits for
//! that answer instead of making its own, and takes no permit of the server's few.
//!
//! Without it, 50 clients each asking for a heap profile and leaving at once, 10 times a
//! second, kept all of the server's answers busy making profiles for clients already gone, and
//! a normal request got `503`. A profile shared this way was made at most one answer's time
//! before the request came, as any profile is a moment old when it arrives. Windows
//! (`?seconds=`) are never shared: each is its own interval, and at most one of a kind runs.

use super::handler::HttpResponse;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::oneshot;

/// What a request asks: everything its answer is made from.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct Question {
    method: http::Method,
    target: String,
    authorization: Option<http::HeaderValue>,
    accept: Option<http::HeaderValue>,
}

impl Question {
    /// What `head` asks; `None` for a window (a `seconds` parameter), which is never shared.
    pub(super) fn of(head: &http::request::Parts) -> Option<Self> {
        if head
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p.starts_with("seconds=")))
        {
            return None;
        }
        let header = |name| head.headers.get(name).cloned();
        Some(Question {
            method: head.method.clone(),
            target: head
                .uri
                .path_and_query()
                .map_or_else(|| head.uri.path().to_owned(), |p| p.as_str().to_owned()),
            authorization: header(http::header::AUTHORIZATION),
            accept: header(http::header::ACCEPT),
        })
    }
}

/// The questions being answered, each with the requests waiting for its answer.
#[derive(Default)]
pub(super) struct Answers {
    waiting: Mutex<HashMap<Question, Vec<oneshot::Sender<Arc<HttpResponse>>>>>,
}

/// A request's turn: to wait for an answer being made, or to make it.
pub(super) enum Turn {
    /// The answer being made; an error when it was not made (no permit, a panic).
    Join(oneshot::Receiver<Arc<HttpResponse>>),
    Lead(Lead),
}

impl Answers {
    /// Joins the answer to `question` being made, or leads it when none is.
    pub(super) fn ask(self: &Arc<Self>, question: Question) -> Turn {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(joined) = waiting.get_mut(&question) {
            let (tx, rx) = oneshot::channel();
            joined.push(tx);
            return Turn::Join(rx);
        }
        waiting.insert(question.clone(), Vec::new());
        Turn::Lead(Lead {
            answers: Arc::clone(self),
            question: Some(question),
        })
    }
}

/// The answer a request makes for every request that joins it before it is made. Dropped
/// without [`Lead::answer`] (no permit, a panic), it lets them go unanswered: they say `503`.
pub(super) struct Lead {
    answers: Arc<Answers>,
    /// Until answered.
    question: Option<Question>,
}

impl Lead {
    /// Gives `response` to every request that joined; later ones ask anew.
    pub(super) fn answer(mut self, response: &Arc<HttpResponse>) {
        for joined in self.take() {
            let _ = joined.send(Arc::clone(response));
        }
    }

    fn take(&mut self) -> Vec<oneshot::Sender<Arc<HttpResponse>>> {
        let Some(question) = self.question.take() else {
            return Vec::new();
        };
        self.answers
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&question)
            .unwrap_or_default()
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        self.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(request: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().uri(request);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn identical_questions_share_one_answer_and_windows_none() {
        let answers = Arc::new(Answers::default());
        let q = Question::of(&head("/debug/pprof/heap", &[("User-Agent", "a")])).unwrap();
        let Turn::Lead(lead) = answers.ask(q.clone()) else {
            panic!("the first leads")
        };
        // Another client's identical request joins it, whatever else its head says.
        let same = Question::of(&head("/debug/pprof/heap", &[("User-Agent", "b")])).unwrap();
        let Turn::Join(mut joined) = answers.ask(same) else {
            panic!("an identical question joins")
        };
        // Another token, format or path is a question of its own.
        for other in [
            head("/debug/pprof/heap", &[("Authorization", "Bearer x")]),
            head("/debug/pprof/heap", &[("Accept", "text/plain")]),
            head("/debug/pprof/heap?debug=1", &[]),
        ] {
            let Turn::Lead(other) = answers.ask(Question::of(&other).unwrap()) else {
                panic!("a question of its own leads")
            };
            drop(other);
        }
        let response = Arc::new(HttpResponse::text(200, "heap"));
        lead.answer(&response);
        assert!(Arc::ptr_eq(&joined.try_recv().unwrap(), &response));
        // Answered: the next asks anew.
        assert!(matches!(answers.ask(q.clone()), Turn::Lead(_)));
        // A lead dropped unanswered leaves those who joined without an answer.
        let Turn::Lead(lead) = answers.ask(q.clone()) else {
            panic!("the previous lead was dropped")
        };
        let Turn::Join(mut joined) = answers.ask(q) else {
            panic!("joins")
        };
        drop(lead);
        assert!(joined.try_recv().is_err());
        assert!(Question::of(&head("/debug/pprof/profile?seconds=5", &[])).is_none());
        assert!(Question::of(&head("/debug/pprof/heap?debug=1&seconds=5", &[])).is_none());
    }
}
