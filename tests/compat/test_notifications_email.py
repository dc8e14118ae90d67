"""E-mail notifications through a real SMTP server (aiosmtpd, started here on loopback):
an alarm a rule matches is mailed to the user a target names, with ThingsBoard's template
fields filled in and a non-ASCII subject encoded; a server that refuses the recipient makes
the delivery fail after its retries, with the server's answer in the delivery log.

Run: GRIDLINKS_BIN=target/debug/gridlinks python -m pytest -q tests/compat/test_notifications_email.py"""

import email
import email.policy
import time
import uuid

import pytest
import requests
from aiosmtpd.controller import Controller

from gridlinks_server import WAIT_S, free_port, gridlinks_server, wait_until

ADMIN_PASSWORD = "compat-pw-" + uuid.uuid4().hex[:8]


class Inbox:
    """Keeps what it is sent; refuses every recipient when `refuse`."""

    def __init__(self, refuse=False):
        self.messages, self.refuse = [], refuse

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.refuse:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 Message accepted"


@pytest.fixture()
def smtp():
    started = []

    def start(refuse=False):
        inbox = Inbox(refuse)
        c = Controller(inbox, hostname="127.0.0.1", port=free_port())
        c.start()
        started.append(c)
        return inbox, c.port

    yield start
    for c in started:
        c.stop()


def api(base, jwt, method, path, body=None):
    r = requests.request(method, base + path, json=body, headers={"X-Authorization": f"Bearer {jwt}"}, timeout=10)
    assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
    return r.json() if r.text else None


def login(base, user, password):
    r = requests.post(base + "/api/auth/login", json={"username": user, "password": password}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["token"]


def mail_rule(base, jwt, subject):
    """A user with an e-mail address, and a rule mailing them every new alarm."""
    user = api(base, jwt, "POST", "/api/user?sendActivationMail=false",
               {"email": "ops@example.com", "authority": "TENANT_ADMIN", "firstName": "Ops", "lastName": "Team"})
    target = api(base, jwt, "POST", "/api/notification/target", {"name": "ops", "configuration": {
        "type": "PLATFORM_USERS", "usersFilter": {"type": "USER_LIST", "usersIds": [user["id"]["id"]]}}})
    template = api(base, jwt, "POST", "/api/notification/template", {
        "name": "mail", "notificationType": "ALARM", "configuration": {"deliveryMethodsTemplates": {
            "EMAIL": {"enabled": True, "subject": subject, "body": "${alarmOriginatorName}: ${details.where} (${action})"}}}})
    rule = api(base, jwt, "POST", "/api/notification/rule", {
        "name": "mail alarms", "templateId": template["id"], "triggerType": "ALARM",
        "triggerConfig": {"triggerType": "ALARM", "notifyOn": ["CREATED"]},
        "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [target["id"]["id"]]}}})
    device = api(base, jwt, "POST", "/api/device", {"name": "pump-7", "type": "default"})
    api(base, jwt, "POST", "/api/alarm", {"originator": device["id"], "type": "Überhitzung", "severity": "CRITICAL",
                                          "details": {"where": "boiler room"}})
    return rule["id"]["id"]


def env(port):
    return {"GRIDLINKS_NOTIFICATIONS_SMTP_HOST": "127.0.0.1", "GRIDLINKS_NOTIFICATIONS_SMTP_PORT": str(port),
            "GRIDLINKS_NOTIFICATIONS_SMTP_SECURITY": "none", "GRIDLINKS_NOTIFICATIONS_SMTP_FROM": "gridlinks@example.com",
            "GRIDLINKS_NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES": "true",
            "GRIDLINKS_NOTIFICATIONS_RETRY_DELAY": "100", "GRIDLINKS_NOTIFICATIONS_MAX_ATTEMPTS": "2"}


def test_an_alarm_is_mailed_through_a_real_smtp_server(tmp_path, smtp):
    inbox, port = smtp()
    with gridlinks_server(tmp_path, ADMIN_PASSWORD, **env(port)) as s:
        jwt = login(s["base"], "admin", ADMIN_PASSWORD)
        mail_rule(s["base"], jwt, "[${alarmSeverity}] ${alarmType}")
        wait_until(lambda: inbox.messages, "the e-mail", timeout=WAIT_S)
        mail_from, to, raw = inbox.messages[0]
        assert (mail_from, to) == ("gridlinks@example.com", ["ops@example.com"])
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        assert msg["Subject"] == "[critical] Überhitzung"
        assert msg.get_content().strip() == "pump-7: boiler room (created)"
        log = api(s["base"], jwt, "GET", "/api/notification/requests?pageSize=10&page=0")["data"]
        assert [d["status"] for d in log[0]["deliveries"]] == ["SENT"]


def test_a_refusing_smtp_server_is_retried_then_logged(tmp_path, smtp):
    inbox, port = smtp(refuse=True)
    with gridlinks_server(tmp_path, ADMIN_PASSWORD, **env(port)) as s:
        jwt = login(s["base"], "admin", ADMIN_PASSWORD)
        rule = mail_rule(s["base"], jwt, "${alarmType}")

        def failed():
            for r in api(s["base"], jwt, "GET", "/api/notification/requests?pageSize=10&page=0")["data"]:
                if r["ruleId"] == rule and r["deliveries"][0]["status"] == "FAILED":
                    return r["deliveries"][0]
        d = wait_until(failed, "the failed delivery", timeout=WAIT_S)
        assert d["attempts"] == 2 and "550" in d["lastError"], d
        assert not inbox.messages
