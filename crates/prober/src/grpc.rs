//! The client side of the standard gRPC health service (`grpc.health.v1.Health/Check`).
//!
//! The two messages are written here from the protocol's field numbers.

use tonic::{Code, codegen::http::uri::PathAndQuery, transport::Endpoint};

const CHECK: &str = "/grpc.health.v1.Health/Check";

/// `HealthCheckResponse.ServingStatus.SERVING`.
pub(crate) const SERVING: i32 = 1;

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse`; the status enum is decoded as its number.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// Why a health check gave no status.
#[derive(Debug)]
pub(crate) enum CheckError {
    /// No connection.
    Connect(tonic::transport::Error),
    /// The server has no health service.
    Unimplemented(String),
    /// The call failed.
    Rpc(Code, String),
}

/// Asks the server at `address` (`host:port`) for the health of `service` (empty: the server).
pub(crate) async fn check(address: &str, service: &str) -> Result<i32, CheckError> {
    let endpoint = Endpoint::from_shared(format!("http://{address}")).map_err(CheckError::Connect)?;
    let channel = endpoint.connect().await.map_err(CheckError::Connect)?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(CheckError::Connect)?;
    let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
    let request = tonic::Request::new(HealthCheckRequest { service: service.to_owned() });
    match grpc.unary(request, PathAndQuery::from_static(CHECK), codec).await {
        Ok(response) => Ok(response.into_inner().status),
        Err(status) if status.code() == Code::Unimplemented => {
            Err(CheckError::Unimplemented(status.message().to_owned()))
        }
        Err(status) => Err(CheckError::Rpc(status.code(), status.message().to_owned())),
    }
}

/// The protocol's name of a serving status.
pub(crate) fn status_name(status: i32) -> &'static str {
    match status {
        0 => "UNKNOWN",
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNRECOGNIZED",
    }
}
