extension LiveView {
    /// The whole page: HTML, CSS and script inline, nothing fetched but `/events`. `?channel=NAME`
    /// picks the channel to follow (the channel list sets it too); `&token=` is a viewer's
    /// ``ViewToken`` (with security); `&until=TEXT` closes the
    /// stream once a change row contains TEXT (headless browsers dump the page once the network
    /// is idle: the browser test uses it).
    static let page = #"""
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <title>StateSync live view</title>
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <style>
          body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #1d1d1f; background: #fafafa; }
          h1 { font-size: 1.3rem; margin: 0 0 .3rem; }
          h2 { font-size: 1rem; margin: 1.2rem 0 .4rem; }
          table { border-collapse: collapse; background: #fff; box-shadow: 0 0 0 1px #ddd; }
          th, td { padding: .25rem .6rem; text-align: left; border-bottom: 1px solid #eee; }
          th { background: #f0f0f3; font-weight: 600; }
          code, td.mono { font-family: ui-monospace, monospace; font-size: 13px; }
          .ok { color: #137333; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; } .muted { color: #777; }
          #channels a { margin-right: .8rem; cursor: pointer; color: #0b57d0; }
          #channels a.picked { font-weight: 700; text-decoration: underline; }
          .old { color: #b3261e; } .new { color: #137333; }
          #summary span { margin-right: 1.2rem; }
        </style>
        </head>
        <body>
        <h1>StateSync <span id="node" class="mono"></span></h1>
        <div id="summary"><span id="ready" class="muted">connecting…</span><span id="version"></span><span id="missing"></span></div>
        <h2>Members and links</h2>
        <table><thead><tr><th>member</th><th>state</th><th>link</th><th>last heard</th><th>missing deltas (lag)</th><th>publish</th></tr></thead>
        <tbody id="members"></tbody></table>
        <h2>Channels</h2>
        <div id="channels" class="muted">none yet</div>
        <h2>Changes <span id="picked" class="muted">(pick a channel)</span></h2>
        <div id="notice" class="muted"></div>
        <table><thead><tr><th>time</th><th>model</th><th>property</th><th>old → new</th><th>version</th><th>origin</th><th>kind</th></tr></thead>
        <tbody id="changes"></tbody></table>
        <script>
        "use strict";
        const params = new URLSearchParams(location.search);
        let channel = params.get("channel") || "";
        const until = params.get("until");
        const token = params.get("token") || "";
        let source = null;
        const $ = (id) => document.getElementById(id);
        function text(tag, value, cls) { const e = document.createElement(tag); e.textContent = value; if (cls) e.className = cls; return e; }
        function json(v) { return v === null || v === undefined ? "null" : JSON.stringify(v); }
        function showStatus(s) {
          const st = s.status;
          $("node").textContent = st.node + " · " + st.publish;
          const ready = s.not_ready.length === 0;
          $("ready").textContent = ready ? "ready" : "not ready: " + s.not_ready.join("; ");
          $("ready").className = ready ? "ok" : "bad";
          $("version").textContent = "latest version " + (st.latest_version || "none");
          $("missing").textContent = "missing deltas " + st.missing_deltas + (s.dropped_changes ? " · " + s.dropped_changes + " changes not shown (viewer too slow)" : "");
          const rows = (st.members || []).map((m) => {
            const tr = document.createElement("tr");
            const self = m.id === st.node;
            tr.append(text("td", m.id + (self ? " (this node)" : ""), "mono"), text("td", m.state, m.state === "alive" ? "ok" : (m.state === "left" ? "muted" : "bad")),
              text("td", self ? "—" : (m.connected ? "connected" : "down"), self ? "muted" : (m.connected ? "ok" : "bad")),
              text("td", m.last_seen_ms_ago === null ? (self ? "—" : "never") : m.last_seen_ms_ago + " ms ago"),
              text("td", String(m.missing_deltas), m.missing_deltas > 0 ? "bad" : ""), text("td", m.publish, "mono"));
            return tr;
          });
          $("members").replaceChildren(...rows);
          const names = Object.keys(st.channels || {}).sort();
          if (names.length) {
            $("channels").replaceChildren(...names.map((name) => {
              const a = text("a", name + " (" + st.channels[name] + (st.channels[name] === 1 ? " model)" : " models)"));
              if (name === channel) a.className = "picked";
              a.onclick = () => { channel = name; history.replaceState(null, "", "?channel=" + encodeURIComponent(name) + (token ? "&token=" + encodeURIComponent(token) : "")); $("changes").replaceChildren(); connect(); };
              return a;
            }));
            $("channels").className = "";
          }
        }
        function showChange(c) {
          const tr = document.createElement("tr");
          const cell = document.createElement("td");
          cell.className = "mono";
          cell.append(text("span", json(c.old), "old"), document.createTextNode(" → "), text("span", json(c.new), "new"));
          tr.append(text("td", new Date().toLocaleTimeString()), text("td", c.model, "mono"), text("td", c.property, "mono"), cell,
            text("td", c.version, "mono"), text("td", c.origin, "mono"), text("td", c.kind, "muted"));
          $("changes").prepend(tr);
          while ($("changes").children.length > 500) $("changes").lastChild.remove();
          if (until && tr.textContent.includes(until)) { source.close(); $("notice").textContent = "stopped: saw " + until; }
        }
        function connect() {
          if (source) source.close();
          $("picked").textContent = channel ? "of " + channel + " (live)" : "(pick a channel)";
          const query = [];
          if (channel) query.push("channel=" + encodeURIComponent(channel));
          if (token) query.push("token=" + encodeURIComponent(token));
          source = new EventSource("events" + (query.length ? "?" + query.join("&") : ""));
          source.addEventListener("status", (e) => showStatus(JSON.parse(e.data)));
          source.addEventListener("change", (e) => showChange(JSON.parse(e.data)));
          source.addEventListener("notice", (e) => { $("notice").textContent = JSON.parse(e.data); });
          source.onerror = () => { $("ready").textContent = "disconnected from the node; retrying…"; $("ready").className = "bad"; };
        }
        connect();
        </script>
        </body>
        </html>
        """#
}
