/* kafka_errors: which producer errors are the message's own (kafka.h, kafka_error_permanent),
 * and which the setup's (kafka_error_setup).
 * A file of its own, apart from the producer in kafka.c, so that the engine's unit test, which
 * links a stand-in producer (tests/unit/fake_kafka.c) in kafka.c's place, classifies errors
 * with this very code rather than a copy that could drift from it. */
#include "kafka.h"

bool kafka_error_permanent(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    /* A timestamp outside the topic's message.timestamp.difference.max.ms: the row's own when
     * it came from its timestamp column (produce.c treats the producer's clock apart). */
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    /* A partition column naming a partition the topic lacks: the row's value, not the moment. */
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
        return true;
    default:
        return false;
    }
}

bool kafka_error_setup(rd_kafka_resp_err_t err)
{
    switch (err) {
    /* Not authorised: an ACL missing or revoked, credentials refused. */
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    /* A topic that does not exist (deleted, or never created with auto-creation off). */
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
        return true;
    default:
        return false;
    }
}

const char *kafka_error_setup_hint(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
        return "create the topic (or enable auto.create.topics.enable on the brokers)";
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
        return "check the relay's Kafka credentials (sasl.* --kafka properties)";
    default:
        return "grant the relay's principal the ACL it needs (WRITE and DESCRIBE on the topic; "
               "IDEMPOTENT_WRITE on the cluster before Kafka 2.8)";
    }
}
