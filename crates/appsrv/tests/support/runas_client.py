"""XML-RPC client of the runas example's tests (crates/appsrv/tests/runas.rs).

Usage: runas_client.py URL < calls.json

stdin holds a JSON list of calls, each [METHOD, [PARAMS...]]; they are made in order with
Python's standard xmlrpc.client (one ServerProxy, so one keep-alive connection while the
server keeps it). stdout gets a JSON list with one outcome per call:

    {"result": VALUE}                        the method's return value
    {"fault": {"code": N, "string": S}}      an XML-RPC fault
    {"http": {"code": N, "reason": S}}       an HTTP error (xmlrpc.client.ProtocolError)
    {"error": S}                             anything else (connection refused, ...)
"""

import json
import sys
import xmlrpc.client


def main():
    url = sys.argv[1]
    calls = json.load(sys.stdin)
    proxy = xmlrpc.client.ServerProxy(url)
    outcomes = []
    for method, params in calls:
        try:
            outcomes.append({"result": getattr(proxy, method)(*params)})
        except xmlrpc.client.Fault as f:
            outcomes.append({"fault": {"code": f.faultCode, "string": f.faultString}})
        except xmlrpc.client.ProtocolError as e:
            outcomes.append({"http": {"code": e.errcode, "reason": e.errmsg}})
            proxy = xmlrpc.client.ServerProxy(url)
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            outcomes.append({"error": "%s: %s" % (type(e).__name__, e)})
            proxy = xmlrpc.client.ServerProxy(url)
    json.dump(outcomes, sys.stdout)


if __name__ == "__main__":
    main()
