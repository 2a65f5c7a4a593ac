//! `/debug/pprof` as an axum router.

use super::handler::{HttpResponse, PprofHandler};

/// `/debug/pprof` as an axum [`Router`](axum::Router), to merge into your own:
/// `app.merge(axum_router(handler))`. Requests run on tokio's blocking pool, since `?seconds=N`
/// waits. Behind the `axum` feature.
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
    use axum::http::{HeaderName, HeaderValue, StatusCode, header};
    use axum::response::{IntoResponse, Response};

    let serve = move |request: axum::extract::Request| {
        let handler = handler.clone();
        async move {
            let (head, _body) = request.into_parts();
            let answer = tokio::task::spawn_blocking(move || handler.handle_request(&head))
                .await
                .unwrap_or_else(|e| {
                    HttpResponse::text(500, format!("the pprof handler failed: {e}\n"))
                });
            let mut response: Response = answer.body.into_response();
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let h = response.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(answer.content_type),
            );
            for (k, v) in answer.headers {
                if let Ok(v) = HeaderValue::from_str(&v) {
                    h.insert(HeaderName::from_static(static_lower(k)), v);
                }
            }
            response
        }
    };
    routes.iter().fold(axum::Router::new(), |r, route| {
        r.route(route, axum::routing::any(serve.clone()))
    })
}

/// The header names [`PprofHandler`] uses, lower-cased as `HeaderName::from_static` requires.
fn static_lower(name: &'static str) -> &'static str {
    match name {
        "WWW-Authenticate" => "www-authenticate",
        "Allow" => "allow",
        "Content-Disposition" => "content-disposition",
        _ => "x-tracing-prof",
    }
}
