import Foundation

/// The self-contained HTML timeline of a trace: one file with the trace and the code that draws
/// it, no network access. A lane per thread; in it, spans nested as the loop nested them (runs,
/// then phases, then callouts, then the runs nested in them...), phases coloured, sleeps grey with
/// what woke them, stalls red, counters as a step graph; a span's name, times and details on
/// hover; wheel to zoom, drag to pan, double-click to see everything. A fragment
/// `#view=FROM,TO` (microseconds from the trace's start, as the axis shows them) opens the page on
/// that stretch, so a link can point at one pass.
///
/// Each lane's header counts its passes, sleeps and spans, and the page carries them as
/// `data-passes`, `data-sleeps`, `data-spans` attributes of `section.lane` (what the browser
/// check in `.ci/timeline-check` reads).
public enum TimelinePage {
    /// Why a file cannot be turned into a timeline.
    public enum InputError: Error, CustomStringConvertible, Equatable {
        /// Larger than ``TimelinePage/maximumInputBytes``.
        case tooLarge(bytes: Int, limit: Int)
        /// Text in an encoding other than UTF-8 (UTF-16 or UTF-32, with or without a byte-order
        /// mark, or bytes that are not valid UTF-8), with what was found. The page embeds the
        /// file's bytes as they are, so it takes UTF-8 only.
        case notUTF8(String)
        /// Not JSON (truncated, or not text at all), with the parser's reason.
        case notJSON(String)
        /// JSON, but not a Chrome trace (no `traceEvents` array, or not an array of events).
        case notATrace(String)
        /// An event the format does not allow, by its index.
        case badEvent(index: Int, reason: String)

        /// What is wrong with the file.
        public var description: String {
            switch self {
            case .tooLarge(let bytes, let limit):
                "the file is \(bytes) bytes or more, above the \(limit)-byte limit (a page that size would not open; record a shorter stretch or a smaller ring)"
            case .notUTF8(let reason): "not UTF-8 text: \(reason); convert it to UTF-8 first (e.g. iconv -f UTF-16 -t UTF-8)"
            case .notJSON(let reason): "not JSON (truncated or corrupt?): \(reason)"
            case .notATrace(let reason): "not a Chrome trace: \(reason)"
            case .badEvent(let index, let reason): "event \(index) is not a valid trace event: \(reason)"
            }
        }
    }

    /// The largest trace file a page is made from: 256 MiB (Perfetto's UI already struggles
    /// beyond that; google/perfetto#99).
    public static let maximumInputBytes = 256 << 20

    /// Checks that `data` is a Chrome Trace Event file in UTF-8 (an object with a `traceEvents` array, or a
    /// bare array of events, each with a string `ph`, numeric `ts` where the phase needs one, and
    /// a numeric `dur` for complete events) and returns its event count.
    ///
    /// - Parameters:
    ///   - data: The file's bytes.
    ///   - limit: The largest size accepted (tests pass a small one).
    public static func validate(_ data: [UInt8], limit: Int = maximumInputBytes) throws(InputError) -> Int {
        guard data.count <= limit else { throw .tooLarge(bytes: data.count, limit: limit) }
        try checkUTF8(data)
        let object: Any
        do {
            object = try JSONSerialization.jsonObject(with: Data(data), options: [.fragmentsAllowed])
        } catch {
            throw .notJSON((error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String ?? "\(error)")
        }
        let events: [Any]
        if let array = object as? [Any] {
            events = array
        } else if let dictionary = object as? [String: Any] {
            guard let array = dictionary["traceEvents"] else { throw .notATrace("it has no \"traceEvents\" key") }
            guard let list = array as? [Any] else { throw .notATrace("\"traceEvents\" is not an array") }
            events = list
        } else {
            throw .notATrace("the top level is neither an object nor an array")
        }
        for (index, element) in events.enumerated() {
            guard let event = element as? [String: Any] else { throw .badEvent(index: index, reason: "not an object") }
            guard let ph = event["ph"] as? String, !ph.isEmpty else {
                throw .badEvent(index: index, reason: "no \"ph\" string")
            }
            if ph != "M" {
                guard let ts = event["ts"] as? NSNumber, ts.doubleValue.isFinite else {
                    throw .badEvent(index: index, reason: "no finite numeric \"ts\"")
                }
            }
            if ph == "X" {
                guard let dur = event["dur"] as? NSNumber, dur.doubleValue.isFinite, dur.doubleValue >= 0 else {
                    throw .badEvent(index: index, reason: "a complete (\"X\") event needs a non-negative \"dur\"")
                }
            }
        }
        return events.count
    }

    /// Refuses what is not UTF-8. The JSON parser detects UTF-16 and UTF-32 and reads them, but the
    /// page embeds the bytes in a UTF-8 document, where such a trace is unreadable (a blank page).
    private static func checkUTF8(_ data: [UInt8]) throws(InputError) {
        if data.starts(with: [0xFE, 0xFF]) { throw .notUTF8("it starts with the UTF-16 big-endian byte-order mark FE FF") }
        if data.starts(with: [0xFF, 0xFE]) { throw .notUTF8("it starts with the UTF-16 (or UTF-32) little-endian byte-order mark FF FE") }
        // JSON text starts with ASCII, which UTF-16 and UTF-32 encode with NUL bytes beside it.
        if let index = data.prefix(4).firstIndex(of: 0) {
            throw .notUTF8("a NUL byte at offset \(index) (UTF-16 or UTF-32 text, or not text at all)")
        }
        guard String(validating: data, as: UTF8.self) == nil else { return }
        var parser = Unicode.UTF8.ForwardParser()
        var bytes = data.makeIterator()
        var offset = 0
        while case .valid(let scalar) = parser.parseScalar(from: &bytes) { offset += scalar.count }
        throw .notUTF8("an invalid UTF-8 sequence at byte \(offset)")
    }

    /// The page for a Chrome trace file, checked first (see ``validate(_:limit:)``).
    public static func html(chromeTrace data: [UInt8], title: String) throws(InputError) -> String {
        _ = try validate(data)
        return page(json: data, title: title)
    }

    /// The page for JSON known to be valid. `<` becomes `\u003c` (outside strings it cannot occur
    /// in JSON), so that nothing in the trace can end the `<script>` element that holds it.
    static func page(json: [UInt8], title: String) -> String {
        var embedded: [UInt8] = []
        embedded.reserveCapacity(json.count)
        for byte in json {
            if byte == UInt8(ascii: "<") {
                embedded.append(contentsOf: Array(#"\u003c"#.utf8))
            } else {
                embedded.append(byte)
            }
        }
        let escapedTitle = title.replacingOccurrences(of: "&", with: "&amp;")
            .replacingOccurrences(of: "<", with: "&lt;").replacingOccurrences(of: ">", with: "&gt;")
        return head.replacingOccurrences(of: "TITLE", with: escapedTitle)
            + String(decoding: embedded, as: UTF8.self) + tail
    }

    private static let head = #"""
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8"><title>TITLE</title>
        <style>
        body{font:13px system-ui,sans-serif;margin:0;background:#fafafa;color:#222}
        header{padding:10px 16px;background:#263238;color:#eceff1}
        header h1{font-size:16px;margin:0 0 4px}
        header p{margin:0;font-size:12px;color:#b0bec5}
        #legend span{display:inline-block;margin-right:12px}
        #legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
        section.lane{margin:8px 16px;background:#fff;border:1px solid #ddd;border-radius:4px}
        section.lane h2{font-size:13px;margin:0;padding:6px 8px;border-bottom:1px solid #eee}
        section.lane h2 small{font-weight:normal;color:#666;margin-left:8px}
        canvas{display:block;width:100%}
        #tip{position:fixed;pointer-events:none;background:#263238;color:#fff;padding:6px 8px;border-radius:4px;
          font:12px ui-monospace,monospace;white-space:pre;display:none;max-width:640px;z-index:2}
        #axis{margin:0 16px;font-size:11px;color:#666}
        </style></head><body>
        <header><h1>TITLE</h1><p id="hint">wheel: zoom · drag: pan · double-click: everything · hover: details</p>
        <p id="legend"></p></header><div id="axis"></div><div id="lanes"></div><div id="tip"></div>
        <script id="trace" type="application/json">
        """#

    private static let tail = #"""
        </script>
        <script>
        "use strict";
        const COLORS={run:"#cfd8dc",observers:"#8e6bd8",blocks:"#e0a030",sources0:"#3a9d5d",timers:"#2f7fd1",
          sources1:"#d1495b",waiting:"#d6d6d6",sleep:"#d6d6d6",stall:"#e53935"};
        function colorOf(e){
          if(e.cat==="run")return COLORS.run;
          if(e.cat==="sleep")return COLORS.sleep;
          const p=(e.args&&e.args.phase)||(e.cat==="phase"?e.name:null);
          if(p&&COLORS[p])return COLORS[p];
          let h=0;for(const c of String(e.name))h=(h*31+c.charCodeAt(0))|0;
          return "hsl("+(Math.abs(h)%360)+",55%,60%)";
        }
        const raw=JSON.parse(document.getElementById("trace").textContent);
        const events=Array.isArray(raw)?raw:(raw.traceEvents||[]);
        const threads=new Map();
        function lane(pid,tid){const k=pid+":"+tid;if(!threads.has(k))threads.set(k,{key:k,tid:tid,name:"thread "+tid,
          sort:1e9,spans:[],instants:[],counters:new Map(),stalls:[],open:new Map()});return threads.get(k);}
        for(const e of events){
          const t=lane(e.pid,e.tid);
          if(e.ph==="M"){if(e.name==="thread_name"&&e.args)t.name=String(e.args.name);
            if(e.name==="thread_sort_index"&&e.args)t.sort=e.args.sort_index;continue;}
          if(e.ph==="X")t.spans.push({ts:+e.ts,dur:+e.dur,name:String(e.name),cat:e.cat||"",args:e.args||{}});
          else if(e.ph==="B")t.open.set("B"+(t.open.size),e);
          else if(e.ph==="i"||e.ph==="I")t.instants.push({ts:+e.ts,name:String(e.name)});
          else if(e.ph==="C"){const n=String(e.name);if(!t.counters.has(n))t.counters.set(n,[]);
            const v=e.args?Object.values(e.args)[0]:0;t.counters.get(n).push({ts:+e.ts,v:+v});}
          else if(e.ph==="b"){t.open.set((e.cat||"")+"/"+e.id,e);}
          else if(e.ph==="e"){const b=t.open.get((e.cat||"")+"/"+e.id);if(b){t.open.delete((e.cat||"")+"/"+e.id);
            t.stalls.push({ts:+b.ts,dur:+e.ts-b.ts,name:String(b.name)});}}
        }
        const lanes=[...threads.values()].filter(t=>t.spans.length||t.instants.length||t.stalls.length||t.counters.size)
          .sort((a,b)=>a.sort-b.sort||a.tid-b.tid);
        let t0=Infinity,t1=-Infinity;
        for(const t of lanes){
          t.spans.sort((a,b)=>a.ts-b.ts||b.dur-a.dur);
          const stack=[];t.levels=0;t.rows=[];
          for(const s of t.spans){
            while(stack.length&&stack[stack.length-1]<=s.ts+1e-9)stack.pop();
            s.level=stack.length;stack.push(s.ts+s.dur);
            if(!t.rows[s.level])t.rows[s.level]=[];t.rows[s.level].push(s);
            t.levels=Math.max(t.levels,s.level+1);
            t0=Math.min(t0,s.ts);t1=Math.max(t1,s.ts+s.dur);
          }
          for(const s of t.stalls){t0=Math.min(t0,s.ts);t1=Math.max(t1,s.ts+s.dur);}
          for(const i of t.instants){t0=Math.min(t0,i.ts);t1=Math.max(t1,i.ts);}
          const ranges=[];let sleeps=0;
          for(const s of t.spans){if(s.cat==="sleep")sleeps++;
            if(s.args&&s.args.pass!==undefined){const a=+s.args.pass;ranges.push([a,s.args.lastPass!==undefined?+s.args.lastPass:a]);}}
          ranges.sort((a,b)=>a[0]-b[0]);let passes=0,end=-Infinity;
          for(const [a,b] of ranges){if(a>end){passes+=b-a+1;end=b;}else if(b>end){passes+=b-end;end=b;}}
          t.passes=passes;t.sleeps=sleeps;
          t.maxCounter=0;for(const l of t.counters.values())for(const p of l)t.maxCounter=Math.max(t.maxCounter,p.v);
        }
        if(!isFinite(t0)){t0=0;t1=1;}if(t1<=t0)t1=t0+1;
        const full=[t0,t1];let view=[t0,t1];
        {const m=/^#view=([0-9.eE+-]+),([0-9.eE+-]+)$/.exec(location.hash);
          if(m&&+m[2]>+m[1])view=[t0+ +m[1],t0+ +m[2]];}
        const ROW=18,TOP=12,COUNTER=26;
        const legend=document.getElementById("legend");
        for(const k of ["observers","blocks","sources0","timers","sources1","sleep","run","stall"])
          legend.insertAdjacentHTML("beforeend","<span><i style=\"background:"+COLORS[k]+"\"></i>"+k+"</span>");
        const root=document.getElementById("lanes");
        const summary=document.createElement("div");summary.id="summary";summary.dataset.lanes=lanes.length;
        summary.dataset.events=events.length;root.appendChild(summary);
        function esc(s){return String(s).replace(/[&<>]/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;"}[c]));}
        for(const t of lanes){
          const sec=document.createElement("section");sec.className="lane";
          sec.dataset.tid=t.tid;sec.dataset.thread=t.name;sec.dataset.passes=t.passes;sec.dataset.sleeps=t.sleeps;
          sec.dataset.spans=t.spans.length;sec.dataset.stalls=t.stalls.length;
          sec.innerHTML="<h2>"+esc(t.name)+"<small>tid "+esc(t.tid)+" · "+t.passes+" passes · "+t.sleeps+" sleeps · "+
            t.spans.length+" spans"+(t.stalls.length?" · "+t.stalls.length+" stalls":"")+"</small></h2>";
          const c=document.createElement("canvas");sec.appendChild(c);root.appendChild(sec);t.canvas=c;
          t.height=TOP+Math.max(1,t.levels)*ROW+(t.counters.size?COUNTER:0)+4;
        }
        function fmt(us){const a=Math.abs(us);if(a>=1e6)return (us/1e6).toFixed(3)+" s";if(a>=1e3)return (us/1e3).toFixed(3)+" ms";
          return us.toFixed(a<10?3:1)+" µs";}
        function draw(){
          const dpr=window.devicePixelRatio||1;
          for(const t of lanes){
            const c=t.canvas,w=c.clientWidth||800,h=t.height;
            c.width=w*dpr;c.height=h*dpr;c.style.height=h+"px";
            const g=c.getContext("2d");g.setTransform(dpr,0,0,dpr,0,0);g.clearRect(0,0,w,h);
            const sx=w/(view[1]-view[0]),X=ts=>(ts-view[0])*sx;
            g.fillStyle="#ffebee";g.strokeStyle=COLORS.stall;
            for(const s of t.stalls){const x=X(s.ts),ww=Math.max(2,s.dur*sx);if(x>w||x+ww<0)continue;
              g.fillRect(x,0,ww,h);g.fillStyle=COLORS.stall;g.fillRect(x,0,ww,4);g.fillStyle="#ffebee";}
            g.fillStyle="#607d8b";
            for(const i of t.instants){const x=X(i.ts);if(x<0||x>w)continue;g.fillRect(x,2,1,7);}
            g.font="11px system-ui,sans-serif";g.textBaseline="middle";
            t.rows.forEach((row,level)=>{
              const y=TOP+level*ROW;let lastX=-1;
              for(const s of row){
                const x=X(s.ts);if(x>w)break;const ww=s.dur*sx;if(x+ww<0)continue;
                if(ww<1&&x<lastX+1)continue;
                lastX=x+Math.max(ww,1);
                g.fillStyle=colorOf(s);g.fillRect(x,y,Math.max(ww,1),ROW-2);
                if(ww>36){g.fillStyle=s.cat==="run"||s.cat==="sleep"?"#263238":"#fff";g.save();g.beginPath();
                  g.rect(x,y,ww,ROW-2);g.clip();
                  const label=s.cat==="sleep"?"sleep → "+(s.args.wake||""):s.name+(s.args.calls>1?" ×"+s.args.calls:"");
                  g.fillText(label,Math.max(x,0)+3,y+ROW/2-1);g.restore();}
              }
            });
            if(t.counters.size&&t.maxCounter>0){
              const base=h-4,top=base-COUNTER+6;g.strokeStyle="#00897b";g.beginPath();
              for(const l of t.counters.values()){let first=true;for(const p of l){const x=X(p.ts),y=base-(p.v/t.maxCounter)*(base-top);
                if(first){g.moveTo(x,y);first=false;}else g.lineTo(x,y);}}
              g.stroke();g.fillStyle="#00897b";g.fillText("max "+t.maxCounter,4,top);
            }
          }
          document.getElementById("axis").textContent=fmt(view[0]-full[0])+" … "+fmt(view[1]-full[0])+
            "  (span "+fmt(view[1]-view[0])+")";
        }
        const tip=document.getElementById("tip");
        function hit(t,ev){
          const r=t.canvas.getBoundingClientRect(),x=ev.clientX-r.left,y=ev.clientY-r.top;
          const ts=view[0]+x*(view[1]-view[0])/r.width,level=Math.floor((y-TOP)/ROW);
          const tol=3*(view[1]-view[0])/r.width;
          for(const s of t.stalls)if(ts>=s.ts&&ts<=s.ts+s.dur&&y<6)return {s:s,kind:"stall"};
          const row=t.rows[level];if(!row)return null;
          let lo=0,hi=row.length-1,best=null;
          while(lo<=hi){const m=(lo+hi)>>1;if(row[m].ts<=ts+tol){best=m;lo=m+1;}else hi=m-1;}
          for(let i=best;i!==null&&i>=0&&i>best-64;i--){const s=row[i];if(ts>=s.ts-tol&&ts<=s.ts+s.dur+tol)return {s:s};}
          return null;
        }
        for(const t of lanes){
          const c=t.canvas;
          c.addEventListener("mousemove",ev=>{
            if(drag){const r=c.getBoundingClientRect(),d=(ev.clientX-drag.x)*(view[1]-view[0])/r.width;
              view=[drag.v[0]-d,drag.v[1]-d];draw();return;}
            const h=hit(t,ev);if(!h){tip.style.display="none";return;}const s=h.s;
            const args=s.args?Object.entries(s.args).map(([k,v])=>k+": "+v).join("\n"):"";
            tip.textContent=(h.kind==="stall"?"stall\n":"")+s.name+(s.cat?"  ["+s.cat+"]":"")+"\nstart "+fmt(s.ts-full[0])+
              "  duration "+fmt(s.dur)+(args?"\n"+args:"");
            tip.style.display="block";tip.style.left=Math.min(ev.clientX+12,innerWidth-300)+"px";tip.style.top=(ev.clientY+12)+"px";
          });
          c.addEventListener("mouseleave",()=>{tip.style.display="none";});
          c.addEventListener("wheel",ev=>{ev.preventDefault();const r=c.getBoundingClientRect();
            const f=(ev.clientX-r.left)/r.width,at=view[0]+f*(view[1]-view[0]);
            const k=Math.exp(ev.deltaY*0.002),span=Math.max((view[1]-view[0])*k,0.01);
            view=[at-f*span,at+(1-f)*span];draw();},{passive:false});
          c.addEventListener("mousedown",ev=>{drag={x:ev.clientX,v:view.slice()};});
          c.addEventListener("dblclick",()=>{view=full.slice();draw();});
        }
        let drag=null;addEventListener("mouseup",()=>{drag=null;});addEventListener("resize",draw);
        draw();
        document.body.dataset.rendered="true";
        </script></body></html>

        """#
}

extension Trace {
    /// The trace as a self-contained HTML timeline (see ``TimelinePage``).
    public func timelineHTML(title: String) -> String {
        TimelinePage.page(json: chromeTraceJSON(), title: title)
    }
}
