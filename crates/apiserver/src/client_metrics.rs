//! The agent's API clients measured as client-go measures its own (component-base's
//! `metrics/prometheus/restclient`), under the same names and labels, so that a dashboard or
//! alert written for upstream's kubelet reads them unchanged:
//!
//! - `rest_client_requests_total` counts every answer by `code`, `method` and `host`, retries
//!   included; an attempt that got no answer (a refused connection, a request given up as
//!   unanswered) is counted with the code `<error>`.
//! - `rest_client_request_size_bytes` records each attempt's body in bytes, by `verb` and `host`.
//! - `rest_client_request_duration_seconds` records each request from the moment it is given to
//!   the client (the wait for a token of the rate limit included) until its answer has been read
//!   to the end; `rest_client_response_size_bytes` records that answer's bytes. Watches are left
//!   out of both, as client-go leaves them out: their answer streams for minutes.
//! - `rest_client_rate_limiter_duration_seconds` (recorded by [`crate::ratelimit`]) records how
//!   long each request waited for its token; a client without a rate limit (the heartbeats')
//!   records none.
//!
//! `verb` and `method` are the HTTP method and `host` the API server's `host:port`, as
//! client-go's. The histograms' buckets are upstream's, in `kubelet_core::metrics::HISTOGRAMS`.
//!
//! Everything is recorded through the `metrics` facade: an agent that installs no recorder pays
//! nothing but the calls.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

/// The labels every series of one client carries: its API server's `host:port`, and the
/// request's method.
#[derive(Debug, Clone)]
pub(crate) struct RequestLabels {
    verb: &'static str,
    host: Arc<str>,
}

impl RequestLabels {
    pub(crate) fn of<B>(request: &Request<B>, host: &Arc<str>) -> RequestLabels {
        RequestLabels { verb: verb(request.method()), host: host.clone() }
    }

    /// Records how long the request waited for its token of the rate limit.
    pub(crate) fn record_rate_limiter_wait(&self, waited: std::time::Duration) {
        metrics::histogram!("rest_client_rate_limiter_duration_seconds", "verb" => self.verb, "host" => self.host.clone())
            .record(waited.as_secs_f64());
    }
}

/// The server's `host:port` of `url` as client-go labels it (`url.URL.Host`): the port only when
/// the URL names one.
pub fn host_label(url: &http::Uri) -> Arc<str> {
    let authority = url.authority().map_or("none", |a| a.as_str());
    // Credentials in the URL are not part of client-go's `Host`.
    Arc::from(authority.rsplit('@').next().unwrap_or(authority))
}

/// The method as a label without allocating for the methods the API uses.
fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Whether `request` is a watch, whose answer streams until the server ends it.
fn is_watch<B>(request: &Request<B>) -> bool {
    request.uri().query().is_some_and(|query| query.split('&').any(|pair| pair == "watch=true" || pair == "watch=1"))
}

/// A [`tower::Layer`] that measures each request as a whole (`rest_client_request_duration_seconds`,
/// `rest_client_response_size_bytes`); it goes outside the rate limit, so that the wait for a token is part of
/// the request's time, as in client-go.
#[derive(Debug, Clone)]
pub struct RequestMetricsLayer {
    host: Arc<str>,
}

impl RequestMetricsLayer {
    /// Requests to the API server at `host` ([`host_label`]).
    pub fn new(host: Arc<str>) -> RequestMetricsLayer {
        RequestMetricsLayer { host }
    }
}

impl<S> tower::Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> RequestMetrics<S> {
        RequestMetrics { inner, host: self.host.clone() }
    }
}

/// The service of [`RequestMetricsLayer`].
#[derive(Debug, Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    host: Arc<str>,
}

/// The future of a [`RequestMetrics`] call.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, RequestBody, ResponseBody> tower::Service<Request<RequestBody>> for RequestMetrics<S>
where
    S: tower::Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<MeteredBody<ResponseBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let started = Instant::now();
        let labels = RequestLabels::of(&request, &self.host);
        let measured = !is_watch(&request);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let mut reading = measured.then_some(Reading { labels, started });
            match answer.await {
                Ok(response) => Ok(response.map(|body| MeteredBody { inner: body, bytes: 0, reading })),
                Err(error) => {
                    if let Some(reading) = reading.take() {
                        reading.finish(None);
                    }
                    Err(error)
                }
            }
        })
    }
}

/// A request whose answer is still being read.
#[derive(Debug)]
struct Reading {
    labels: RequestLabels,
    started: Instant,
}

impl Reading {
    /// Records the request's time and, when its answer was read to the end, the answer's size.
    fn finish(self, answer_bytes: Option<u64>) {
        let RequestLabels { verb, host } = self.labels;
        if let Some(bytes) = answer_bytes {
            #[allow(clippy::cast_precision_loss)] // A histogram's value; exact below 2^53 bytes.
            metrics::histogram!("rest_client_response_size_bytes", "verb" => verb, "host" => host.clone())
                .record(bytes as f64);
        }
        metrics::histogram!("rest_client_request_duration_seconds", "verb" => verb, "host" => host)
            .record(self.started.elapsed().as_secs_f64());
    }
}

/// An answer's body, counting its bytes as they are read; when it ends (or is dropped unread)
/// its request is recorded.
#[derive(Debug)]
pub struct MeteredBody<B> {
    inner: B,
    bytes: u64,
    /// `None` for a watch, and once recorded.
    reading: Option<Reading>,
}

impl<B> Body for MeteredBody<B>
where
    B: Body + Unpin,
    B::Data: AsRef<[u8]>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.bytes += frame.data_ref().map_or(0, |data| data.as_ref().len() as u64);
            }
            Poll::Ready(None) => {
                if let Some(reading) = this.reading.take() {
                    reading.finish(Some(this.bytes));
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for MeteredBody<B> {
    fn drop(&mut self) {
        if let Some(reading) = self.reading.take() {
            reading.finish(None);
        }
    }
}

/// A [`tower::Layer`] that counts each attempt of a request (`rest_client_requests_total`,
/// `rest_client_request_size_bytes`); it goes inside the retries, so that each retry is counted, as in
/// client-go.
#[derive(Debug, Clone)]
pub struct AttemptMetricsLayer {
    host: Arc<str>,
}

impl AttemptMetricsLayer {
    /// Attempts to reach the API server at `host` ([`host_label`]).
    pub fn new(host: Arc<str>) -> AttemptMetricsLayer {
        AttemptMetricsLayer { host }
    }
}

impl<S> tower::Layer<S> for AttemptMetricsLayer {
    type Service = AttemptMetrics<S>;

    fn layer(&self, inner: S) -> AttemptMetrics<S> {
        AttemptMetrics { inner, host: self.host.clone() }
    }
}

/// The service of [`AttemptMetricsLayer`].
#[derive(Debug, Clone)]
pub struct AttemptMetrics<S> {
    inner: S,
    host: Arc<str>,
}

impl<S, RequestBody, ResponseBody> tower::Service<Request<RequestBody>> for AttemptMetrics<S>
where
    S: tower::Service<Request<RequestBody>, Response = Response<ResponseBody>>,
    S::Future: Send + 'static,
    RequestBody: Body,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let RequestLabels { verb, host } = RequestLabels::of(&request, &self.host);
        if let Some(bytes) = request.body().size_hint().exact() {
            #[allow(clippy::cast_precision_loss)] // A histogram's value; exact below 2^53 bytes.
            metrics::histogram!("rest_client_request_size_bytes", "verb" => verb, "host" => host.clone())
                .record(bytes as f64);
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = match &answer {
                Ok(response) => response.status().as_str().to_owned(),
                Err(_) => "<error>".to_owned(),
            };
            metrics::counter!("rest_client_requests_total", "code" => code, "method" => verb, "host" => host)
                .increment(1);
            answer
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use http_body_util::{BodyExt, Full};
    use metrics_exporter_prometheus::PrometheusBuilder;
    use tower::{Layer, Service, ServiceExt};

    use super::*;

    /// Runs `test` on a paused clock with a recorder of its own, and returns what the recorder
    /// renders afterwards.
    pub(crate) fn recorded<F: Future<Output = ()>>(test: impl FnOnce() -> F) -> String {
        let recorder =
            PrometheusBuilder::new().set_buckets(&[0.005, 0.025, 0.1]).expect("buckets are not empty").build_recorder();
        let handle = recorder.handle();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        metrics::with_local_recorder(&recorder, || runtime.block_on(test()));
        handle.render()
    }

    /// The value of `series` (its name and labels) in `rendered`.
    pub(crate) fn value(rendered: &str, series: &str) -> f64 {
        let line = rendered
            .lines()
            .find(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with(' ')))
            .unwrap_or_else(|| panic!("no {series} in:\n{rendered}"));
        line[series.len()..].trim().parse().unwrap()
    }

    #[test]
    fn the_host_label_is_host_and_port_as_client_go_has_it() {
        assert_eq!(&*host_label(&"https://127.0.0.1:6443".parse().unwrap()), "127.0.0.1:6443");
        assert_eq!(&*host_label(&"https://api.example.com/prefix".parse().unwrap()), "api.example.com");
        assert_eq!(&*host_label(&"https://me:secret@api.example.com:443".parse().unwrap()), "api.example.com:443");
        assert_eq!(&*host_label(&"/api/v1/pods".parse().unwrap()), "none");
    }

    #[test]
    fn each_attempt_is_counted_by_code_or_as_an_error() {
        let rendered = recorded(|| async {
            let answers = tower::service_fn(|request: Request<Full<&'static [u8]>>| async move {
                match request.uri().path() {
                    "/refused" => Err("connection refused"),
                    "/missing" => Ok(Response::builder().status(404).body(()).unwrap()),
                    _ => Ok(Response::new(())),
                }
            });
            let mut service = AttemptMetricsLayer::new(Arc::from("10.0.0.1:6443")).layer(answers);
            for (method, path, body) in
                [("PATCH", "/", "{\"a\":1}"), ("PATCH", "/", "{}"), ("GET", "/missing", ""), ("POST", "/refused", "x")]
            {
                let request = Request::builder().method(method).uri(path).body(Full::new(body.as_bytes())).unwrap();
                let _ = service.ready().await.unwrap().call(request).await;
            }
        });
        let value = |series: &str| value(&rendered, &series.replace("HOST", "host=\"10.0.0.1:6443\""));
        assert_eq!(value("rest_client_requests_total{code=\"200\",method=\"PATCH\",HOST}"), 2.0);
        assert_eq!(value("rest_client_requests_total{code=\"404\",method=\"GET\",HOST}"), 1.0);
        assert_eq!(value("rest_client_requests_total{code=\"<error>\",method=\"POST\",HOST}"), 1.0);
        // Two PATCH bodies of 7 and 2 bytes; a GET's empty body is 0 bytes, as client-go counts it.
        assert_eq!(value("rest_client_request_size_bytes_sum{verb=\"PATCH\",HOST}"), 9.0);
        assert_eq!(value("rest_client_request_size_bytes_count{verb=\"GET\",HOST}"), 1.0);
        assert_eq!(value("rest_client_request_size_bytes_sum{verb=\"GET\",HOST}"), 0.0);
    }

    #[test]
    fn a_request_is_timed_until_its_answer_is_read_and_a_watch_is_not_timed() {
        let rendered = recorded(|| async {
            let slow = tower::service_fn(|_: Request<()>| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, std::convert::Infallible>(Response::new(Full::new("twelve bytes".as_bytes())))
            });
            let mut service = RequestMetricsLayer::new(Arc::from("h:1")).layer(slow);
            let get = Request::get("/api/v1/pods").body(()).unwrap();
            let answer = service.ready().await.unwrap().call(get).await.unwrap();
            // The answer is read 50 ms after its headers came: 70 ms in all.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(answer.into_body().collect().await.unwrap().to_bytes().len(), 12);

            let watch = Request::get("/api/v1/pods?watch=true&resourceVersion=1").body(()).unwrap();
            let answer = service.ready().await.unwrap().call(watch).await.unwrap();
            drop(answer);
        });
        let value = |series: &str| value(&rendered, series);
        let took = value("rest_client_request_duration_seconds_sum{verb=\"GET\",host=\"h:1\"}");
        assert!((took - 0.070).abs() < 1e-9, "20 ms to the headers and 50 more to the end: {took}");
        assert_eq!(
            value("rest_client_request_duration_seconds_count{verb=\"GET\",host=\"h:1\"}"),
            1.0,
            "the watch is left out"
        );
        assert_eq!(value("rest_client_response_size_bytes_sum{verb=\"GET\",host=\"h:1\"}"), 12.0);
        assert_eq!(value("rest_client_response_size_bytes_count{verb=\"GET\",host=\"h:1\"}"), 1.0);
    }
}
