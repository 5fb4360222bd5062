// live.js: the review pages follow the process's live feed (GET /events,
// server-sent events from its one watch of the task bucket) and refresh
// their live part (#live) when a task changes (on a task page: that task),
// without reloading the page. While the reviewer is typing a note, has
// ticked items or opened a form, the page is left alone and says it
// changed (#stale) instead.
(function () {
  "use strict";
  var body = document.body;
  // The queue page's "tick every item on this page" (no inline script: CSP).
  document.addEventListener("click", function (e) {
    if (!e.target || e.target.id !== "tick-all") return;
    var boxes = document.querySelectorAll("input[data-tick]");
    for (var i = 0; i < boxes.length; i++) boxes[i].checked = true;
  });
  var mode = body.dataset.live;
  if (!mode || !window.EventSource) return;
  var task = body.dataset.task || "";
  var wait = task ? 200 : 1000; // a list refreshes at most once a second
  var timer = null, busy = false, again = false, refreshed = 0;

  function dirty() {
    var live = document.getElementById("live");
    if (!live) return false;
    var a = document.activeElement;
    if (a && live.contains(a) && /^(TEXTAREA|INPUT|SELECT)$/.test(a.tagName)) return true;
    var fields = live.querySelectorAll("textarea, input[type=text], input[type=search], input:not([type])");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value.trim() !== "" && fields[i].value !== fields[i].defaultValue) return true;
    }
    return live.querySelector("input[type=checkbox]:checked, details[open]") !== null;
  }

  function stale() {
    var s = document.getElementById("stale");
    if (s) s.hidden = false;
  }

  function refresh() {
    if (busy) { again = true; return; }
    if (dirty()) { stale(); return; }
    busy = true;
    fetch(location.href, { credentials: "same-origin", headers: { "X-Live": "1" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var cur = document.getElementById("live");
        if (!fresh || !cur) return;
        if (dirty()) { stale(); return; }
        cur.replaceWith(document.importNode(fresh, true));
        refreshed++;
        body.dataset.refreshed = String(refreshed);
      })
      .catch(function () { stale(); })
      .finally(function () {
        busy = false;
        if (again) { again = false; schedule(); }
      });
  }

  function schedule() {
    if (timer !== null) return;
    timer = setTimeout(function () { timer = null; refresh(); }, wait);
  }

  // The feed sends changes from the moment a page subscribes, and keeps
  // no history: every (re)connection refreshes once, for what changed
  // between the page's render (or the last connection) and now. A hidden
  // page lets its stream go — a browser holds six connections per host,
  // and each open tab would keep one — and follows again when shown.
  var es = null;
  function follow() {
    if (es) return;
    es = new EventSource("/events" + (task ? "?task=" + encodeURIComponent(task) : ""));
    es.addEventListener("change", schedule);
    es.addEventListener("open", function () { body.dataset.following = "1"; schedule(); });
  }
  function unfollow() {
    if (!es) return;
    es.close();
    es = null;
    body.dataset.following = "";
  }
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) unfollow(); else follow();
  });
  if (!document.hidden) follow();
})();
