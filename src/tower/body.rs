//! The bodies a [`RateLimit`](super::RateLimit) refusal is written in: [`RefusalBody`], and
//! [`ResponseBody`] for servers whose own body type cannot hold a refusal.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

pin_project_lite::pin_project! {
    /// The body of a [`RateLimit`](super::RateLimit) response: the inner service's body,
    /// untouched, or a refusal's (the configured text, or nothing for a gRPC refusal).
    ///
    /// It lets the layer answer for any server whose bodies carry [`Bytes`] (hyper, axum,
    /// tonic's `tonic::body::Body`) without asking the server's body type to be built from
    /// a string, as tower-http's middleware do. A refusal's length is exact (hyper sends it
    /// as `Content-Length`), and an empty refusal is at its end from the start, so over
    /// HTTP/2 a gRPC refusal is one HEADERS frame with END_STREAM (gRPC's "trailers-only"
    /// response).
    ///
    /// ```
    /// use http_body::Body as _;
    /// use turnstile::tower::ResponseBody;
    ///
    /// let served = ResponseBody::new(String::from("ok"));
    /// assert_eq!(served.size_hint().exact(), Some(2));
    /// ```
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
        },
        // `None` once sent, or from the start for an empty refusal: the end of the body.
        Refusal {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, passed through as it is.
    pub fn new(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    /// A refusal's body: `data`, or nothing if it is empty (then the body is at its end
    /// before its first frame).
    pub fn refusal(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Refusal {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

/// A response body type a refusal can be written in: the inner service's own, so that the
/// layer passes allowed responses through untouched (no wrapper for axum to box on every
/// response, as it does with any body that is not its own) and builds only its refusals.
///
/// Implemented for axum's `Body` (feature `axum`), tonic's `tonic::body::Body` (feature
/// `tonic`) and [`ResponseBody`]; a server with another body type wraps its responses in
/// [`ResponseBody::new`] under the layer (e.g. with tower's `MapResponseLayer`).
pub trait RefusalBody: Sized {
    /// A refusal's body: `text`, or, when it is empty (a gRPC refusal), a body at its end
    /// from the start, so that HTTP/2 ends the stream with the headers (gRPC's
    /// "trailers-only" response).
    fn refusal(text: Bytes) -> Self;
}

impl<B> RefusalBody for ResponseBody<B> {
    fn refusal(text: Bytes) -> Self {
        ResponseBody::refusal(text)
    }
}

#[cfg(feature = "axum")]
impl RefusalBody for axum::body::Body {
    fn refusal(text: Bytes) -> Self {
        if text.is_empty() {
            axum::body::Body::empty()
        } else {
            axum::body::Body::from(text)
        }
    }
}

#[cfg(feature = "tonic")]
impl RefusalBody for tonic::body::Body {
    fn refusal(text: Bytes) -> Self {
        if text.is_empty() {
            tonic::body::Body::empty()
        } else {
            // String's body never fails: the error tonic's body needs an Into for.
            tonic::body::Body::new(ResponseBody::<String>::refusal(text))
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Refusal { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Refusal { data } => data.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Refusal { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `body` to its end without a runtime: a refusal's body is always ready.
    fn frames(mut body: ResponseBody<String>) -> Vec<Bytes> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => out.push(f.into_data().unwrap()),
                Poll::Ready(Some(Err(e))) => match e {},
                Poll::Ready(None) => break,
                Poll::Pending => unreachable!("a refusal's body is always ready"),
            }
        }
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
        out
    }

    #[test]
    fn a_refusal_is_its_text_with_an_exact_length() {
        let body = ResponseBody::<String>::refusal(Bytes::from_static(b"busy"));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(4));
        assert_eq!(frames(body), [Bytes::from_static(b"busy")]);
    }

    #[test]
    fn an_empty_refusal_is_at_its_end_from_the_start() {
        let body = ResponseBody::<String>::refusal(Bytes::new());
        // What makes hyper send a gRPC refusal as one HEADERS frame with END_STREAM.
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
        assert!(frames(body).is_empty());
    }

    #[test]
    fn the_inner_body_passes_through() {
        let body = ResponseBody::new(String::from("ok"));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(2));
        assert_eq!(frames(body), [Bytes::from_static(b"ok")]);
    }
}
