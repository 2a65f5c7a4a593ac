//! `/debug/pprof` as an axum router.

use super::coalesce::{Answering, to_http};
use super::handler::PprofHandler;

/// `/debug/pprof` as an axum [`Router`](axum::Router), to merge into your own:
/// `app.merge(axum_router(handler))`. Requests run on tokio's blocking pool, since `?seconds=N`
/// waits: at most 8 at once ([`MAX_CONNECTIONS`](super::MAX_CONNECTIONS); more are answered
/// `503` with `Retry-After`), a request identical to one being answered sharing its answer,
/// as on the standalone server. Behind the `axum` feature.
///
/// # Examples
/// ```no_run
/// # async fn serve(guard: tracing_prof_core::ProfilerGuard) -> std::io::Result<()> {
/// use tracing_prof_export::http::{PprofHandler, axum_router};
/// let app = axum::Router::new().merge(axum_router(PprofHandler::new(guard.profiler().clone())));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await
/// # }
/// ```
pub fn axum_router(handler: PprofHandler) -> axum::Router {
    router(
        handler,
        &["/debug/pprof", "/debug/pprof/", "/debug/pprof/{*rest}"],
    )
}

/// `/metrics` (span metrics for Prometheus, see [`crate::metrics`]) as an axum
/// [`Router`](axum::Router) of its own: merge it where your app has no `/metrics` route of its
/// own (merging two panics), or serve it on another port. Behind the `axum` feature.
pub fn axum_metrics_router(handler: PprofHandler) -> axum::Router {
    router(handler, &["/metrics"])
}

/// A router answering `routes` with `handler`.
fn router(handler: PprofHandler, routes: &[&str]) -> axum::Router {
    let answering = std::sync::Arc::new(Answering::default());
    let serve = move |request: axum::extract::Request| {
        let (handler, answering) = (handler.clone(), std::sync::Arc::clone(&answering));
        async move {
            let (head, _body) = request.into_parts();
            let answer = answering.answer(&handler, head).await;
            to_http(answer).map(axum::body::Body::new)
        }
    };
    routes.iter().fold(axum::Router::new(), |r, route| {
        r.route(route, axum::routing::any(serve.clone()))
    })
}
