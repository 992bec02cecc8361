//! Kafka ACLs for tests. On a broker started with [`AUTHORIZER`] every
//! PLAINTEXT client is `User:ANONYMOUS`, allowed everything on a resource
//! without ACLs, so a test denies exactly the right it takes away; the
//! secured broker (`kafka_secure`) allows nothing by default, and its
//! tests grant and deny a principal of their own.
//! rust-rdkafka wraps no ACL admin call: this calls librdkafka's CreateAcls
//! through rdkafka's own bindings.

use std::ffi::{c_char, CStr, CString};

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;

use super::admin_ffi::admin_result;

pub use rd::rd_kafka_AclOperation_t as Operation;
pub use rd::rd_kafka_ResourcePatternType_t as Pattern;
pub use rd::rd_kafka_ResourceType_t as Resource;

/// Server properties of a broker with ACLs that lets everyone do anything
/// on a resource without ACLs (so only what a test denies is denied).
pub const AUTHORIZER: &str =
    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
     allow.everyone.if.no.acl.found=true";

/// Denies `User:ANONYMOUS` (every PLAINTEXT client) `operation` on the
/// resources `name` matches. The broker applies it a moment later: the
/// caller waits for its effect. Once a resource has an ACL, the authoriser
/// denies whatever no ACL allows: [`allow_anonymous`] `All` first to take
/// away one right alone.
pub fn deny_anonymous(
    bootstrap: &str,
    resource: Resource,
    name: &str,
    pattern: Pattern,
    operation: Operation,
) {
    deny(bootstrap, ANONYMOUS, resource, name, pattern, operation)
}

/// Denies `principal` (`User:name`) `operation` on the resources `name`
/// matches, through `bootstrap` (a listener whose principal may alter
/// ACLs): the way to take away a right that another right implies, such
/// as DESCRIBE with WRITE.
pub fn deny(
    bootstrap: &str,
    principal: &str,
    resource: Resource,
    name: &str,
    pattern: Pattern,
    operation: Operation,
) {
    create_acl(
        bootstrap,
        principal,
        resource,
        name,
        pattern,
        operation,
        rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_DENY,
    )
}

/// Allows `User:ANONYMOUS` `operation` on the resources `name` matches (a
/// DENY of the same principal wins over it).
pub fn allow_anonymous(
    bootstrap: &str,
    resource: Resource,
    name: &str,
    pattern: Pattern,
    operation: Operation,
) {
    allow(bootstrap, ANONYMOUS, resource, name, pattern, operation)
}

/// Every PLAINTEXT client.
const ANONYMOUS: &str = "User:ANONYMOUS";

/// Allows `principal` (`User:name`) `operation` on the resources `name`
/// matches, through `bootstrap` (a listener whose principal may alter ACLs).
pub fn allow(
    bootstrap: &str,
    principal: &str,
    resource: Resource,
    name: &str,
    pattern: Pattern,
    operation: Operation,
) {
    create_acl(
        bootstrap,
        principal,
        resource,
        name,
        pattern,
        operation,
        rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
    )
}

fn create_acl(
    bootstrap: &str,
    principal: &str,
    resource: Resource,
    name: &str,
    pattern: Pattern,
    operation: Operation,
    permission: rd::rd_kafka_AclPermissionType_t,
) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let name = CString::new(name).unwrap();
    let principal = CString::new(principal).unwrap();
    let host = CString::new("*").unwrap();
    let mut errstr = [0 as c_char; 512];
    let rk = admin.inner().native_ptr();
    // SAFETY: every pointer handed to librdkafka is valid for the call (the
    // CStrings and the buffer outlive it, `rk` lives as long as `admin`);
    // the binding, queue and event are destroyed once each, after their last
    // use; the result's array belongs to the event and is read before it
    // is destroyed.
    let outcome = unsafe {
        let mut binding = rd::rd_kafka_AclBinding_new(
            resource,
            name.as_ptr(),
            pattern,
            principal.as_ptr(),
            host.as_ptr(),
            operation,
            permission,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        assert!(
            !binding.is_null(),
            "AclBinding_new: {}",
            CStr::from_ptr(errstr.as_ptr()).to_string_lossy()
        );
        let outcome = admin_result(
            rk,
            "CreateAcls",
            30_000,
            |queue| rd::rd_kafka_CreateAcls(rk, &mut binding, 1, std::ptr::null(), queue),
            |event| {
                let result = rd::rd_kafka_event_CreateAcls_result(event);
                let mut n = 0;
                let acls = rd::rd_kafka_CreateAcls_result_acls(result, &mut n);
                (0..n)
                    .map(|i| rd::rd_kafka_acl_result_error(*acls.add(i)))
                    .find(|e| !e.is_null())
                    .map_or(Ok(()), |e| {
                        Err(format!(
                            "{:?}",
                            RDKafkaErrorCode::from(rd::rd_kafka_error_code(e))
                        ))
                    })
            },
        );
        rd::rd_kafka_AclBinding_destroy(binding);
        outcome
    };
    outcome.unwrap_or_else(|e| panic!("CreateAcls: {e}"));
}

/// Denies every client READ and DESCRIBE on every consumer group, and
/// waits until the broker applies it: a group's committed offsets, read
/// before, can no longer be (the coordinator lookup is refused).
pub fn deny_every_group(bootstrap: &str) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    use std::time::{Duration, Instant};

    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "acl-probe")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("acl-probe", 0, Offset::Invalid)
        .unwrap();
    let committed = || probe.committed_offsets(tpl.clone(), Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(60);
    // A new broker makes its offsets topic at the first ask.
    while let Err(e) = committed() {
        assert!(
            Instant::now() < deadline,
            "no group works even before the ACLs: {e}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for operation in [
        Operation::RD_KAFKA_ACL_OPERATION_DESCRIBE,
        Operation::RD_KAFKA_ACL_OPERATION_READ,
    ] {
        deny_anonymous(
            bootstrap,
            Resource::RD_KAFKA_RESOURCE_GROUP,
            "*",
            Pattern::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
            operation,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while committed().is_ok() {
        assert!(
            Instant::now() < deadline,
            "the group ACLs were not applied within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Deletes the DENY of `operation` on `name` for `principal` that
/// [`deny`] made (the way to give back a right that another right
/// implies). Returns how many ACLs it deleted; the broker applies it a
/// moment later.
pub fn remove_deny(
    bootstrap: &str,
    principal: &str,
    resource: Resource,
    name: &str,
    pattern: Pattern,
    operation: Operation,
) -> usize {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let name = CString::new(name).unwrap();
    let principal = CString::new(principal).unwrap();
    let host = CString::new("*").unwrap();
    let mut errstr = [0 as c_char; 512];
    let rk = admin.inner().native_ptr();
    // SAFETY: as in `create_acl`: the pointers outlive the calls, each
    // object is destroyed once after its last use, the result's arrays
    // belong to the event and are read before it is destroyed.
    let outcome = unsafe {
        let mut filter = rd::rd_kafka_AclBindingFilter_new(
            resource,
            name.as_ptr(),
            pattern,
            principal.as_ptr(),
            host.as_ptr(),
            operation,
            rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_DENY,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        assert!(
            !filter.is_null(),
            "AclBindingFilter_new: {}",
            CStr::from_ptr(errstr.as_ptr()).to_string_lossy()
        );
        let outcome = admin_result(
            rk,
            "DeleteAcls",
            30_000,
            |queue| rd::rd_kafka_DeleteAcls(rk, &mut filter, 1, std::ptr::null(), queue),
            |event| {
                let result = rd::rd_kafka_event_DeleteAcls_result(event);
                let mut n = 0;
                let responses = rd::rd_kafka_DeleteAcls_result_responses(result, &mut n);
                let mut deleted = 0;
                let mut failed = None;
                for i in 0..n {
                    let response = *responses.add(i);
                    let error = rd::rd_kafka_DeleteAcls_result_response_error(response);
                    if !error.is_null() {
                        failed = Some(format!(
                            "{:?}",
                            RDKafkaErrorCode::from(rd::rd_kafka_error_code(error))
                        ));
                    }
                    let mut matching = 0;
                    rd::rd_kafka_DeleteAcls_result_response_matching_acls(response, &mut matching);
                    deleted += matching;
                }
                failed.map_or(Ok(deleted), Err)
            },
        );
        rd::rd_kafka_AclBinding_destroy(filter);
        outcome
    };
    outcome.unwrap_or_else(|e| panic!("DeleteAcls: {e}"))
}
