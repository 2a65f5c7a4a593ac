//! [`Answering`]: at most [`MAX_CONNECTIONS`] answers made at once, for either server (the
//! standalone one and the axum mount), each on tokio's blocking pool of the runtime serving
//! it; past them, `503` with `Retry-After`.
//!
//! Identical requests answered at once share one answer, as Go's `singleflight` shares a call:
//! a request asking what a request being answered asks (the same method, path and query,
//! `Authorization` and `Accept`: all a [`PprofHandler`](super::PprofHandler) reads) waits for
//! that answer instead of making its own, and takes no permit of the server's few.
//!
//! Without it, 50 clients each asking for a heap profile and leaving at once, 10 times a
//! second, kept all of the server's answers busy making profiles for clients already gone, and
//! a normal request got `503`. A profile shared this way was made at most one answer's time
//! before the request came, as any profile is a moment old when it arrives. Windows
//! (`?seconds=`) are never shared: each is its own interval (and at most
//! [`MAX_WINDOWS`](super::MAX_WINDOWS) run at once).

use super::MAX_CONNECTIONS;
use super::handler::{HttpResponse, PprofHandler};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{Semaphore, oneshot};

/// The answers a server makes: at most [`MAX_CONNECTIONS`] at once, each holding its permit
/// until its handler returns, even if its client has gone; identical requests sharing one.
pub(super) struct Answering {
    work: Arc<Semaphore>,
    answers: Arc<Answers>,
}

impl Default for Answering {
    fn default() -> Self {
        Answering {
            work: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            answers: Arc::default(),
        }
    }
}

impl Answering {
    /// The answer to `head`: the one being made to an identical request, else `503` past
    /// [`MAX_CONNECTIONS`] answers at once, else the handler's, made on the blocking pool (a
    /// window waits its `seconds`).
    pub(super) async fn answer(
        &self,
        handler: &PprofHandler,
        head: http::request::Parts,
    ) -> Arc<HttpResponse> {
        let handler = handler.clone();
        let question = Question::of(&head);
        self.answer_with(question, move || handler.handle_request(&head))
            .await
    }

    /// The answer to `question` (`None`: one never shared), made by `make` when it is not
    /// being made already.
    async fn answer_with(
        &self,
        question: Option<Question>,
        make: impl FnOnce() -> HttpResponse + Send + 'static,
    ) -> Arc<HttpResponse> {
        let lead = match question.map(|q| self.answers.ask(q)) {
            Some(Turn::Join(made)) => return made.await.unwrap_or_else(|_| Arc::new(busy())),
            Some(Turn::Lead(lead)) => Some(lead),
            None => None,
        };
        let Ok(permit) = Arc::clone(&self.work).try_acquire_owned() else {
            return Arc::new(busy());
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let response = Arc::new(make());
            // Here, not in the request's task: those who joined are answered even when its
            // client has gone.
            if let Some(lead) = lead {
                lead.answer(&response);
            }
            response
        })
        .await
        .unwrap_or_else(|e| {
            Arc::new(HttpResponse::text(
                500,
                format!("the pprof handler failed: {e}\n"),
            ))
        })
    }
}

/// An answer's body, shared by every request it answers (not copied for each).
struct SharedBody(Arc<HttpResponse>);

impl AsRef<[u8]> for SharedBody {
    fn as_ref(&self) -> &[u8] {
        &self.0.body
    }
}

/// `answer` as either server sends it (hyper's `Response`, axum's once its body is boxed).
pub(super) fn to_http(
    answer: Arc<HttpResponse>,
) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let mut response = http::Response::new(http_body_util::Full::new(bytes::Bytes::from_owner(
        SharedBody(Arc::clone(&answer)),
    )));
    *response.status_mut() = http::StatusCode::from_u16(answer.status)
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(answer.content_type),
    );
    for (name, value) in &answer.headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            headers.insert(name, value);
        }
    }
    response
}

/// `503` with `Retry-After`.
fn busy() -> HttpResponse {
    let mut r = HttpResponse::text(503, "too many requests at once; try again\n");
    r.headers.push(("Retry-After", "1".into()));
    r
}

/// What a request asks: everything its answer is made from.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Question {
    method: http::Method,
    target: String,
    authorization: Option<http::HeaderValue>,
    accept: Option<http::HeaderValue>,
}

impl Question {
    /// What `head` asks; `None` for a window (a `seconds` parameter), which is never shared.
    fn of(head: &http::request::Parts) -> Option<Self> {
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
struct Answers {
    waiting: Mutex<HashMap<Question, Vec<oneshot::Sender<Arc<HttpResponse>>>>>,
}

/// A request's turn: to wait for an answer being made, or to make it.
enum Turn {
    /// The answer being made; an error when it was not made (no permit, a panic).
    Join(oneshot::Receiver<Arc<HttpResponse>>),
    Lead(Lead),
}

impl Answers {
    /// Joins the answer to `question` being made, or leads it when none is.
    fn ask(self: &Arc<Self>, question: Question) -> Turn {
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
struct Lead {
    answers: Arc<Answers>,
    /// Until answered.
    question: Option<Question>,
}

impl Lead {
    /// Gives `response` to every request that joined; later ones ask anew.
    fn answer(mut self, response: &Arc<HttpResponse>) {
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

    /// 20 answers asked at once, each taking 200 ms on the blocking pool: of 20 different
    /// questions, 8 are made at once and 12 answered `503`; of 20 identical ones, one is made
    /// and all 20 get it.
    #[test]
    fn at_most_eight_answers_at_once_and_identical_requests_share_one() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let answering = Arc::new(Answering::default());
        let (running, most, made) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let ask_all = |paths: Vec<String>| {
            let _runtime = rt.enter();
            let mut set = tokio::task::JoinSet::new();
            for path in paths {
                let answering = Arc::clone(&answering);
                let (running, most, made) =
                    (Arc::clone(&running), Arc::clone(&most), Arc::clone(&made));
                let question = Question::of(&head(&path, &[]));
                set.spawn(async move {
                    answering
                        .answer_with(question, move || {
                            most.fetch_max(
                                running.fetch_add(1, Ordering::SeqCst) + 1,
                                Ordering::SeqCst,
                            );
                            std::thread::sleep(std::time::Duration::from_millis(200));
                            running.fetch_sub(1, Ordering::SeqCst);
                            made.fetch_add(1, Ordering::SeqCst);
                            HttpResponse::text(200, "made")
                        })
                        .await
                });
            }
            rt.block_on(set.join_all())
        };
        let different = ask_all(
            (0..20)
                .map(|i| format!("/debug/pprof/heap?n={i}"))
                .collect(),
        );
        let statuses = |answers: &[Arc<HttpResponse>], status| {
            answers.iter().filter(|a| a.status == status).count()
        };
        assert_eq!(
            (statuses(&different, 200), statuses(&different, 503)),
            (MAX_CONNECTIONS, 20 - MAX_CONNECTIONS)
        );
        assert_eq!(most.load(Ordering::SeqCst), MAX_CONNECTIONS);
        made.store(0, Ordering::SeqCst);
        let same = ask_all(vec!["/debug/pprof/heap".to_owned(); 20]);
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert!(
            same.iter()
                .all(|a| Arc::ptr_eq(a, &same[0]) && a.status == 200)
        );
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
