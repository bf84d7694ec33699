# Writes the template unit outbox-relay@.service from outbox-relay.service.in (Makefile,
# tools/unit-check.sh): one deployment per instance name, each with its own configuration,
# credential and environment file, so the hardening and every other line stay in one place.
s|relay\.json|%i.json|g
s|outbox-relay/database-url|outbox-relay/%i.database-url|g
s|outbox-relay/environment|outbox-relay/%i.environment|g
s|^Description=.*|& (%i)|
s|`systemctl edit outbox-relay`|`systemctl edit outbox-relay@NAME`|
s|^# Several relays on one host (two databases, say): the template outbox-relay@.service, written$|# Several relays on one host (two databases, say): this template, written from|
s|^# from this file by systemd/template.sed, takes @SYSCONFDIR@|# outbox-relay.service by systemd/template.sed, takes @SYSCONFDIR@|
